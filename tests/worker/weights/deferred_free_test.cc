// DeferredFree (services/worker/weights/deferred_free.h): what an update replaced is destroyed on
// the freeing thread, never the caller's; Drain waits for everything queued before it; the
// destructor frees what is still queued. Posted tasks run there too, in order with the frees.
#include "services/worker/weights/deferred_free.h"

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace rl::worker {
namespace {

// Records the thread that destroys it; the first one can be made to wait.
struct Tracked {
  Tracked(std::atomic<int>* alive, std::thread::id* freed_on, absl::Notification* gate)
      : alive(alive), freed_on(freed_on), gate(gate) {
    alive->fetch_add(1);
  }
  ~Tracked() {
    if (gate != nullptr) gate->WaitForNotification();
    *freed_on = std::this_thread::get_id();
    alive->fetch_sub(1);
  }
  std::atomic<int>* alive;
  std::thread::id* freed_on;
  absl::Notification* gate;
};

TEST(DeferredFreeTest, FreesOnItsOwnThreadAndDrainWaitsForIt) {
  std::atomic<int> alive{0};
  std::thread::id freed_on;
  absl::Notification gate;
  DeferredFree reaper(/*nice=*/5);
  reaper.Free(std::make_unique<Tracked>(&alive, &freed_on, &gate));
  EXPECT_EQ(alive.load(), 1);  // the free waits for the gate: queued, not freed yet
  std::atomic<bool> drained{false};
  std::thread drainer([&] {
    reaper.Drain();
    drained.store(true);
  });
  gate.Notify();
  drainer.join();
  EXPECT_TRUE(drained.load());
  EXPECT_EQ(alive.load(), 0);  // Drain returned only after the free
  EXPECT_NE(freed_on, std::this_thread::get_id());
  EXPECT_NE(freed_on, std::thread::id());
  EXPECT_EQ(reaper.freed(), 1);
  // Anything movable: a vector of objects, an empty pointer.
  std::vector<std::unique_ptr<Tracked>> many;
  std::thread::id other;
  for (int i = 0; i < 3; ++i) many.push_back(std::make_unique<Tracked>(&alive, &other, nullptr));
  reaper.Free(std::move(many));
  reaper.Free(std::unique_ptr<Tracked>());
  reaper.Drain();
  EXPECT_EQ(alive.load(), 0);
  EXPECT_EQ(reaper.freed(), 3);
}

TEST(DeferredFreeTest, PostedTasksRunOnTheThreadInOrder) {
  DeferredFree worker(/*nice=*/3);
  std::vector<int> order;  // written on the thread only; read after Drain
  std::thread::id ran_on;
  std::atomic<int> alive{0};
  std::thread::id freed_on;
  worker.Post([&] {
    order.push_back(1);
    ran_on = std::this_thread::get_id();
  });
  worker.Free(std::make_unique<Tracked>(&alive, &freed_on, nullptr));
  worker.Post([&, owned = std::make_unique<int>(2)] { order.push_back(*owned); });
  worker.Drain();
  EXPECT_EQ(order, (std::vector<int>{1, 2}));
  EXPECT_NE(ran_on, std::this_thread::get_id());
  EXPECT_EQ(freed_on, ran_on);
  EXPECT_EQ(alive.load(), 0);
  EXPECT_EQ(worker.freed(), 3);
}

TEST(DeferredFreeTest, DestructorFreesWhatIsStillQueued) {
  std::atomic<int> alive{0};
  std::thread::id freed_on;
  {
    DeferredFree reaper(0);
    for (int i = 0; i < 5; ++i) {
      reaper.Free(std::make_unique<Tracked>(&alive, &freed_on, nullptr));
    }
  }
  EXPECT_EQ(alive.load(), 0);
}

}  // namespace
}  // namespace rl::worker
