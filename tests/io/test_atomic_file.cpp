// AtomicFileWriter (sim/io/atomic_file.h): the target appears whole at commit(), and
// remove_unfinished_atomic_files() (what an interrupt handler calls before it exits)
// unlinks the temporary files of the writers alive, and only theirs.
#include <unistd.h>

#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "sim/io/atomic_file.h"
#include "test_util.h"

using namespace kvb;
namespace fs = std::filesystem;

namespace {

// The temporary name AtomicFileWriter writes `target` under.
fs::path temporary_of(const fs::path& target) { return target.string() + ".tmp." + std::to_string(::getpid()); }

void touch(const fs::path& file) { std::ofstream(file) << "not a writer's"; }

}  // namespace

TEST_CASE("atomic file: the target appears at commit, the temporary is gone") {
  const fs::path dir = test::scratch_dir("atomic_commit");
  const fs::path target = dir / "a.txt";
  AtomicFileWriter out(target);
  out.write("hello");
  CHECK(fs::exists(temporary_of(target)));
  CHECK_FALSE(fs::exists(target));
  out.commit();
  CHECK(fs::exists(target));
  CHECK_FALSE(fs::exists(temporary_of(target)));
}

TEST_CASE("atomic file: remove_unfinished_atomic_files unlinks the temporaries of the writers alive") {
  const fs::path dir = test::scratch_dir("atomic_unfinished");
  const fs::path first = dir / "first.safetensors", second = dir / "second.npy";
  AtomicFileWriter a(first), b(second);
  a.write("partial");
  REQUIRE(fs::exists(temporary_of(first)));
  REQUIRE(fs::exists(temporary_of(second)));
  remove_unfinished_atomic_files();
  CHECK_FALSE(fs::exists(temporary_of(first)));
  CHECK_FALSE(fs::exists(temporary_of(second)));
  CHECK_FALSE(fs::exists(first));
  CHECK_FALSE(fs::exists(second));
}

TEST_CASE("atomic file: committed or destroyed writers are no longer tracked") {
  const fs::path dir = test::scratch_dir("atomic_untracked");
  const fs::path committed = dir / "committed.txt", abandoned = dir / "abandoned.txt";
  {
    AtomicFileWriter out(committed);
    out.write("whole");
    out.commit();
  }
  { AtomicFileWriter out(abandoned); }  // destroyed without commit: its temporary removed
  CHECK_FALSE(fs::exists(temporary_of(abandoned)));
  // Files now at the writers' old temporary names belong to someone else: left alone.
  touch(temporary_of(committed));
  touch(temporary_of(abandoned));
  remove_unfinished_atomic_files();
  CHECK(fs::exists(temporary_of(committed)));
  CHECK(fs::exists(temporary_of(abandoned)));
  CHECK(fs::exists(committed));
}

TEST_CASE("atomic file: more writers than tracked slots are still written whole") {
  const fs::path dir = test::scratch_dir("atomic_many");
  std::vector<std::unique_ptr<AtomicFileWriter>> writers;
  for (int i = 0; i < 20; ++i) {
    writers.push_back(std::make_unique<AtomicFileWriter>(dir / ("f" + std::to_string(i))));
    writers.back()->write("x");
  }
  for (auto& w : writers) w->commit();
  for (int i = 0; i < 20; ++i) CHECK(fs::exists(dir / ("f" + std::to_string(i))));
  writers.clear();
  // Every slot is free again: a new writer is tracked.
  const fs::path last = dir / "last";
  AtomicFileWriter out(last);
  remove_unfinished_atomic_files();
  CHECK_FALSE(fs::exists(temporary_of(last)));
}
