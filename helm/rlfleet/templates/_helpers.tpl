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

{{- define "rlfleet.adminKeyEnv" -}}
{{- if .Values.adminKeySecret }}
- name: RL_ADMIN_API_KEY
  valueFrom:
    secretKeyRef: {name: {{ .Values.adminKeySecret }}, key: admin-api-key}
{{- end }}
{{- end -}}
