// Test helpers for the reliability suite: real rl-worker / rl-router processes (fork + exec of
// the built binaries), their readiness line, liveness and peak RSS, and raw gRPC calls.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "tests/testing/test_data.h"

namespace rl::testing {

// One child process; stdout+stderr go to a log file that is scanned for lines.
class Process {
 public:
  // Starts `binary` (a name under BUILD_DIR/bin, or a path) with `args` and extra environment
  // entries.
  Process(const std::string& binary, const std::vector<std::string>& args,
          const std::map<std::string, std::string>& env = {}) {
    char tmpl[] = "/tmp/rl-proc-XXXXXX";
    const int fd = mkstemp(tmpl);
    log_path_ = tmpl;
    std::vector<std::string> argv_s = {
        binary.find('/') != std::string::npos ? binary : BuildDir() + "/bin/" + binary};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    pid_ = fork();
    if (pid_ == 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
      std::vector<char*> argv;
      for (auto& a : argv_s) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      const std::string err = "cannot exec " + argv_s[0] + "\n";
      (void)!write(2, err.data(), err.size());
      _exit(127);
    }
    close(fd);
  }
  ~Process() { Stop(); }

  // Waits for a log line starting with `prefix` and returns the rest of it ("" on timeout).
  std::string WaitForLine(const std::string& prefix, std::chrono::seconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      std::ifstream in(log_path_);
      std::string line;
      while (std::getline(in, line)) {
        const size_t at = line.find(prefix);
        if (at != std::string::npos) return line.substr(at + prefix.size());
      }
      if (!Alive()) return "";
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return "";
  }
  std::string Log() const {
    std::ifstream in(log_path_);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

  bool Alive() {
    if (pid_ <= 0 || exited_) return false;
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      exited_ = true;
      exit_status_ = status;
      return false;
    }
    return true;
  }
  int exit_status() const { return exit_status_; }
  pid_t pid() const { return pid_; }
  // Peak resident set (VmHWM) in MiB, -1 when unknown.
  int64_t PeakRssMiB() const {
    std::ifstream in(absl::StrCat("/proc/", pid_, "/status"));
    std::string line;
    while (std::getline(in, line)) {
      if (absl::StartsWith(line, "VmHWM:")) {
        std::vector<std::string> parts = absl::StrSplit(line, ' ', absl::SkipEmpty());
        int64_t kb = 0;
        if (parts.size() >= 2 && absl::SimpleAtoi(parts[1], &kb)) return kb / 1024;
      }
    }
    return -1;
  }
  std::string Cmdline() const {
    std::ifstream in(absl::StrCat("/proc/", pid_, "/cmdline"));
    std::stringstream ss;
    ss << in.rdbuf();
    std::string s = ss.str();
    for (char& c : s) c = c == '\0' ? ' ' : c;
    return s;
  }

  void Stop() {
    if (pid_ <= 0 || exited_) return;
    kill(pid_, SIGTERM);
    for (int i = 0; i < 200 && Alive(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (Alive()) {
      kill(pid_, SIGKILL);
      waitpid(pid_, &exit_status_, 0);
      exited_ = true;
    }
    std::remove(log_path_.c_str());
  }

 private:
  pid_t pid_ = -1;
  bool exited_ = false;
  int exit_status_ = 0;
  std::string log_path_;
};

// Starts a server binary and waits for "listening on HOST:PORT"; returns the address or "".
inline std::string StartServer(Process& p) {
  std::string addr = p.WaitForLine("listening on ", std::chrono::seconds(120));
  while (!addr.empty() && (addr.back() == '\r' || addr.back() == ' ')) addr.pop_back();
  return addr;
}

// Sends `bodies` as the raw messages of one client-streaming call to `method` (any bytes: a
// message that does not parse included), half-closes, and returns the call's status (within
// `deadline`).
inline grpc::Status RawStream(const std::shared_ptr<grpc::Channel>& channel,
                              const std::string& method, const std::vector<std::string>& bodies,
                              const std::string& key = "",
                              std::chrono::seconds deadline = std::chrono::seconds(60)) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + deadline);
  if (!key.empty()) ctx.AddMetadata("authorization", "Bearer " + key);
  grpc::CompletionQueue cq;
  auto call = stub.PrepareCall(&ctx, method, &cq);
  void* tag;
  bool ok;
  call->StartCall(reinterpret_cast<void*>(1));
  cq.Next(&tag, &ok);
  for (const std::string& body : bodies) {
    if (!ok) break;
    grpc::Slice slice(body);
    grpc::ByteBuffer buffer(&slice, 1);
    call->Write(buffer, reinterpret_cast<void*>(2));
    cq.Next(&tag, &ok);
  }
  if (ok) {
    call->WritesDone(reinterpret_cast<void*>(3));
    cq.Next(&tag, &ok);
  }
  grpc::ByteBuffer reply;
  for (;;) {
    call->Read(&reply, reinterpret_cast<void*>(4));
    cq.Next(&tag, &ok);
    if (!ok) break;
  }
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  cq.Next(&tag, &ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return status;
}

// Sends raw bytes as the single request message of `method` and returns the call's status.
inline grpc::Status RawCall(const std::shared_ptr<grpc::Channel>& channel,
                            const std::string& method, const std::string& bytes,
                            const std::string& key = "") {
  return RawStream(channel, method, {bytes}, key, std::chrono::seconds(30));
}

}  // namespace rl::testing
