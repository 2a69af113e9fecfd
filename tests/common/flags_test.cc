#include "common/flags.h"

#include "gtest/gtest.h"

namespace rl {
namespace {

struct Config {
  std::string model;
  int port = 8000;
  int64_t big = 0;
  double kv_gb = 1.5;
  bool verbose = false;
  std::vector<std::string> workers;
};

FlagSet MakeFlags(Config* c) {
  FlagSet f("prog");
  f.String("model", &c->model, "model dir");
  f.Int("port", &c->port, "port");
  f.Int("big", &c->big, "big");
  f.Double("kv-cache-gb", &c->kv_gb, "kv");
  f.Bool("verbose", &c->verbose, "verbose");
  f.StringList("worker", &c->workers, "workers");
  return f;
}

TEST(Flags, ParsesAllForms) {
  Config c;
  FlagSet f = MakeFlags(&c);
  auto pos = f.Parse({"--model", "/m", "--port=0", "--kv-cache-gb", "0.25", "--verbose", "gen",
                      "--worker", "a:1", "--worker=b:2", "--big", "9000000000", "--", "--x"});
  ASSERT_TRUE(pos.ok()) << pos.status();
  EXPECT_EQ(c.model, "/m");
  EXPECT_EQ(c.port, 0);
  EXPECT_EQ(c.big, 9000000000);
  EXPECT_DOUBLE_EQ(c.kv_gb, 0.25);
  EXPECT_TRUE(c.verbose);
  EXPECT_EQ(c.workers, (std::vector<std::string>{"a:1", "b:2"}));
  EXPECT_EQ(*pos, (std::vector<std::string>{"gen", "--x"}));
}

TEST(Flags, ErrorsNameTheFlag) {
  Config c;
  FlagSet f = MakeFlags(&c);
  auto r = f.Parse({"--port", "eighty"});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("--port"), std::string::npos);
  EXPECT_NE(f.Parse({"--nope"}).status().message().find("unknown flag --nope"), std::string::npos);
  EXPECT_NE(f.Parse({"--model"}).status().message().find("missing value"), std::string::npos);
  EXPECT_FALSE(f.Parse({"--verbose=maybe"}).ok());
}

TEST(Flags, HelpAndUsage) {
  Config c;
  FlagSet f = MakeFlags(&c);
  ASSERT_TRUE(f.Parse({"--help"}).ok());
  EXPECT_TRUE(f.help_requested());
  EXPECT_NE(f.Usage().find("--kv-cache-gb  kv (default: 1.5)"), std::string::npos);
}

TEST(Flags, IsSetTellsAnEmptyValueFromNoFlag) {
  Config c;
  FlagSet f = MakeFlags(&c);
  ASSERT_TRUE(f.Parse({"--model", ""}).ok());
  EXPECT_TRUE(f.IsSet("model"));
  EXPECT_FALSE(f.IsSet("verbose"));
  ASSERT_TRUE(f.Parse({"--verbose"}).ok());  // a new Parse forgets the last one's flags
  EXPECT_FALSE(f.IsSet("model"));
  EXPECT_TRUE(f.IsSet("verbose"));
}

}  // namespace
}  // namespace rl
