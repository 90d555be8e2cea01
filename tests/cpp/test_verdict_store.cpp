// Guard verdicts kept across processes (fusion/verdict_store.h) and a guard seeded from one.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "fusion/guard.h"
#include "fusion/verdict_store.h"

using namespace neuron;
using fusion::GuardVerdict;
using fusion::KeyGuard;
using fusion::RunMode;
using fusion::StoredVerdict;
using fusion::VerdictStore;

namespace {

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    path = std::filesystem::temp_directory_path() /
           ("neuron-verdicts-" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

fusion::GuardReport report(GuardVerdict v, double ratio) {
  fusion::GuardReport r;
  r.verdict = v;
  r.ratio = ratio;
  r.pairs = 6;
  r.trial = 1;
  return r;
}

}  // namespace

TEST(VerdictStore, FormatAndParseRoundTrip) {
  for (GuardVerdict v : {GuardVerdict::kKeep, GuardVerdict::kDemote, GuardVerdict::kUndecidedDemote}) {
    const auto back = VerdictStore::parse(VerdictStore::format({v, 0.8125}));
    ASSERT_TRUE(back.has_value());
    EXPECT_EQ(back->verdict, v);
    EXPECT_DOUBLE_EQ(back->ratio, 0.8125);
  }
}

TEST(VerdictStore, MalformedTextIsNoVerdict) {
  for (const char* text : {"", "kept", "kept ", "kept x", "none 1.0\n", "maybe 0.5\n", "kept -1\n",
                           "kept nan\n", "kept 0.5 extra\n", "demoted 1e999\n"})
    EXPECT_FALSE(VerdictStore::parse(text).has_value()) << text;
}

TEST(VerdictStore, KeepsVerdictsPerKeyAndContext) {
  TempDir dir;
  const VerdictStore a(dir.path.string(), "policy A threads=2");
  const VerdictStore b(dir.path.string(), "policy B threads=2");
  EXPECT_FALSE(a.load(42).has_value());
  ASSERT_TRUE(a.store(42, report(GuardVerdict::kDemote, 1.2)));
  ASSERT_TRUE(a.store(43, report(GuardVerdict::kKeep, 0.5)));
  EXPECT_FALSE(a.store(44, report(GuardVerdict::kNone, 1.0)));  // no verdict: nothing kept
  EXPECT_EQ(a.load(42)->verdict, GuardVerdict::kDemote);
  EXPECT_EQ(a.load(43)->verdict, GuardVerdict::kKeep);
  EXPECT_FALSE(a.load(44).has_value());
  EXPECT_FALSE(b.load(42).has_value());  // another policy measured nothing yet
  // A later verdict of the same key replaces the earlier one.
  ASSERT_TRUE(a.store(42, report(GuardVerdict::kKeep, 0.9)));
  EXPECT_EQ(a.load(42)->verdict, GuardVerdict::kKeep);
  a.forget(42);
  EXPECT_FALSE(a.load(42).has_value());
  a.forget(42);  // nothing to drop: no error
  // A damaged file is no verdict.
  std::ofstream(a.dir() + "/" + std::string("000000000000002b")) << "garbage";
  EXPECT_FALSE(a.load(43).has_value());
}

TEST(VerdictStore, NoRootKeepsNothing) {
  const VerdictStore none("", "ctx");
  EXPECT_FALSE(none.enabled());
  EXPECT_FALSE(none.store(1, report(GuardVerdict::kKeep, 0.5)));
  EXPECT_FALSE(none.load(1).has_value());
}

TEST(VerdictStore, ASeededGuardStartsInItsVerdictsMode) {
  fusion::GuardSettings s;
  KeyGuard kept(7, s);
  kept.seed(GuardVerdict::kKeep, 0.6);
  EXPECT_FALSE(kept.on_trial());
  EXPECT_EQ(kept.next_mode(), RunMode::kFused);
  EXPECT_FALSE(kept.retry_due(1000000));  // a kept program is never re-tried
  EXPECT_EQ(kept.last_report().verdict, GuardVerdict::kKeep);

  KeyGuard demoted(8, s);
  demoted.seed(GuardVerdict::kUndecidedDemote, 1.1);
  EXPECT_FALSE(demoted.on_trial());
  EXPECT_EQ(demoted.next_mode(), RunMode::kPerOp);
  EXPECT_FALSE(demoted.retry_due(s.retry_after - 1));
  EXPECT_TRUE(demoted.retry_due(s.retry_after));  // re-tried with backoff, as after a trial
  demoted.start_trial();
  EXPECT_TRUE(demoted.on_trial());

  // A guard already on trial is left alone.
  KeyGuard busy(9, s);
  busy.start_trial();
  busy.seed(GuardVerdict::kKeep, 0.5);
  EXPECT_TRUE(busy.on_trial());
}
