// The episode store's figures on the router's /metrics (rl_router_episodes_*): gauges read at
// scrape time from EpisodeStore::GetStats (episodes, turns and tokens held; totals of turns
// recorded and refused, exports, samples exported, episodes removed by an export and collected
// by age, version or the episode bound). docs/episodes.md lists them.
//
// Cost: one lock of the store per gauge per scrape.
#pragma once

#include "common/metrics.h"
#include "services/router/episodes/episode_store.h"

namespace rl::router {

// Registers the gauges in `registry`; `store` must outlive its scrapes.
void RegisterEpisodeMetrics(MetricsRegistry* registry, const EpisodeStore* store);

}  // namespace rl::router
