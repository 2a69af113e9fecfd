// A sender that dies mid-stream, for tensor_stream_test: opens Admin.UpdateWeightsFromTensor on
// ADDR, sends the options and one whole tensor (model.norm.weight of stories260K, [64] F32, all
// 0.5), prints "sent" and waits to be killed (SIGKILL, so its stream ends without its end
// message nor a half-close). Not a test by itself.
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "grpcpp/grpcpp.h"
#include "rl/v1/admin.grpc.pb.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: tensor_sender ADDR\n");
    return 2;
  }
  auto stub =
      rl::v1::Admin::NewStub(grpc::CreateChannel(argv[1], grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  rl::v1::AdminResponse resp;
  auto writer = stub->UpdateWeightsFromTensor(&ctx, &resp);
  rl::v1::UpdateWeightsFromTensorRequest m;
  m.set_weight_version(41);
  const std::vector<float> half(64, 0.5f);
  m.mutable_chunk()->set_name("model.norm.weight");
  m.mutable_chunk()->set_dtype("F32");
  m.mutable_chunk()->add_shape(64);
  m.mutable_chunk()->set_data(std::string(reinterpret_cast<const char*>(half.data()), 64 * 4));
  if (!writer->Write(m)) {
    std::fprintf(stderr, "write failed\n");
    return 1;
  }
  std::printf("sent\n");
  std::fflush(stdout);
  std::this_thread::sleep_for(std::chrono::minutes(10));
  return 0;
}
