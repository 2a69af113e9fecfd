#include "services/router/pool/worker.h"

#include <utility>

#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"

namespace rl::router {

Worker::Worker(std::string address) : address_(std::move(address)) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(512 << 20);
  args.SetMaxSendMessageSize(512 << 20);
  channel_ = grpc::CreateCustomChannel(address_, grpc::InsecureChannelCredentials(), args);
  worker_stub_ = rl::v1::Worker::NewStub(channel_);
  admin_stub_ = rl::v1::Admin::NewStub(channel_);
  data_stubs_.push_back(rl::v1::Worker::NewStub(channel_));
  for (int i = 1; i < kDataChannels; ++i) {
    grpc::ChannelArguments data_args = args;
    data_args.SetInt("rl-data-channel", i);  // a connection of its own
    data_stubs_.push_back(rl::v1::Worker::NewStub(
        grpc::CreateCustomChannel(address_, grpc::InsecureChannelCredentials(), data_args)));
  }
}

Lease::Lease(std::shared_ptr<Worker> w, int32_t units)
    : worker_(std::move(w)), units_(units > 0 ? units : 1) {
  if (worker_) {
    worker_->in_flight_.fetch_add(1);
    worker_->load_.fetch_add(units_);
  }
}

Lease::Lease(Lease&& other) noexcept
    : worker_(std::move(other.worker_)), units_(std::exchange(other.units_, 0)) {}

void Lease::Drop() {
  if (worker_) {
    worker_->in_flight_.fetch_sub(1);
    worker_->load_.fetch_sub(units_);
  }
  worker_.reset();
  units_ = 0;
}

Lease& Lease::operator=(Lease&& other) noexcept {
  if (this != &other) {
    Drop();
    worker_ = std::move(other.worker_);
    units_ = std::exchange(other.units_, 0);
  }
  return *this;
}

Lease::~Lease() { Drop(); }

}  // namespace rl::router
