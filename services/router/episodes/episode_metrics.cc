#include "services/router/episodes/episode_metrics.h"

#include <cstdint>

namespace rl::router {
namespace {

struct EpisodeGauge {
  const char* name;
  const char* help;
  int64_t (*read)(const EpisodeStats&);
};

constexpr EpisodeGauge kEpisodeGauges[] = {
    {"rl_router_episodes_live", "Agent episodes held.",
     [](const EpisodeStats& s) { return s.episodes; }},
    {"rl_router_episodes_turns", "Turns held, all episodes.",
     [](const EpisodeStats& s) { return s.turns; }},
    {"rl_router_episodes_tokens", "Tokens held, all turns' trajectories.",
     [](const EpisodeStats& s) { return s.tokens; }},
    {"rl_router_episodes_bytes",
     "Bytes held, all turns: trajectories (17 per token) and routing (R3).",
     [](const EpisodeStats& s) { return s.bytes; }},
    {"rl_router_episodes_turns_recorded_total", "Turns recorded.",
     [](const EpisodeStats& s) { return s.recorded_turns; }},
    {"rl_router_episodes_turns_refused_total",
     "Turns served but not recorded: over --max-episode-turns or --max-episode-tokens.",
     [](const EpisodeStats& s) { return s.refused_turns; }},
    {"rl_router_episodes_exports_total", "GetEpisode answers.",
     [](const EpisodeStats& s) { return s.exports; }},
    {"rl_router_episodes_exported_samples_total", "Samples (branches) in GetEpisode answers.",
     [](const EpisodeStats& s) { return s.exported_samples; }},
    {"rl_router_episodes_removed_total", "Episodes forgotten by GetEpisode with remove.",
     [](const EpisodeStats& s) { return s.removed; }},
    {"rl_router_episodes_collected_total",
     "Episodes dropped by age (--episode-ttl-s), weight version or --max-episodes.",
     [](const EpisodeStats& s) { return s.collected; }},
};

}  // namespace

void RegisterEpisodeMetrics(MetricsRegistry* registry, const EpisodeStore* store) {
  for (const EpisodeGauge& g : kEpisodeGauges) {
    auto read = g.read;
    registry->SetGaugeCallback(
        g.name, g.help, {}, [store, read] { return static_cast<double>(read(store->GetStats())); });
  }
}

}  // namespace rl::router
