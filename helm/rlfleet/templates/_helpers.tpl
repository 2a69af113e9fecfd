{{- define "rlfleet.name" -}}{{ .Release.Name }}-rlfleet{{- end -}}

{{- define "rlfleet.labels" -}}
app.kubernetes.io/name: rlfleet
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}

{{- define "rlfleet.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* GPU resources in one place: nvidia.com/gpu limits when gpus > 0. */}}
{{- define "rlfleet.gpuResources" -}}
{{- $r := deepCopy .Values.worker.resources -}}
{{- if gt (int .Values.worker.gpus) 0 -}}
{{- $limits := default dict $r.limits -}}
{{- $_ := set $limits "nvidia.com/gpu" (int .Values.worker.gpus) -}}
{{- $_ := set $r "limits" $limits -}}
{{- end -}}
{{ toYaml $r }}
{{- end -}}

{{- define "rlfleet.securityContext" -}}
runAsNonRoot: true
runAsUser: {{ .Values.runAsUser }}
allowPrivilegeEscalation: false
capabilities: {drop: ["ALL"]}
{{- end -}}

{{/* Keys come from Secrets mounted as files (not argv, not env). */}}
{{- define "rlfleet.keyArgs" -}}
{{- if .Values.adminKeySecret }}
- --admin-api-key-file=/etc/rlfleet/keys/admin-api-key
{{- end }}
{{- if .Values.apiKeySecret }}
- --api-key-file=/etc/rlfleet/keys/api-key
{{- end }}
{{- end -}}

{{- define "rlfleet.keyVolumeMounts" -}}
{{- if or .Values.adminKeySecret .Values.apiKeySecret }}
- {name: keys, mountPath: /etc/rlfleet/keys, readOnly: true}
{{- end }}
{{- end -}}

{{- define "rlfleet.keyVolumes" -}}
{{- if or .Values.adminKeySecret .Values.apiKeySecret }}
- name: keys
  projected:
    defaultMode: 0440
    sources:
      {{- if .Values.adminKeySecret }}
      - secret:
          name: {{ .Values.adminKeySecret }}
          items: [{key: admin-api-key, path: admin-api-key}]
      {{- end }}
      {{- if .Values.apiKeySecret }}
      - secret:
          name: {{ .Values.apiKeySecret }}
          items: [{key: api-key, path: api-key}]
      {{- end }}
{{- end }}
{{- end -}}

{{/* --max-* request limits from .Values.limits (maxPromptBytes -> --max-prompt-bytes). */}}
{{- define "rlfleet.limitArgs" -}}
{{- range $k, $v := .Values.limits }}
- --{{ kebabcase $k }}={{ int64 $v }}
{{- end }}
{{- end -}}

{{/* The optional init container that writes the model under /models (values: model.init). */}}
{{- define "rlfleet.modelInit" -}}
{{- if .Values.model.init.image }}
initContainers:
  - name: model-init
    image: {{ .Values.model.init.image }}
    command: {{- toYaml .Values.model.init.command | nindent 6 }}
    env: {{- toYaml .Values.model.init.env | nindent 6 }}
    securityContext: {{- include "rlfleet.securityContext" . | nindent 6 }}
    volumeMounts:
      - {name: models, mountPath: /models}
{{- end }}
{{- end -}}
