// model_io/file_read: owned reads refuse non-regular and oversized files, and the spare-buffer
// pool hands a released buffer to the next read of about its size with that file's bytes only.
#include "common/model_io/file_read.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_data.h"

namespace rl::model_io {
namespace {

using ::testing::HasSubstr;

std::string TempDir() {
  static const rl::testing::TempDir dir;
  return dir.path();
}

std::string WriteFile(const std::string& name, size_t size, char fill) {
  const std::string path = TempDir() + "/" + name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  const std::string block(size, fill);
  out.write(block.data(), static_cast<std::streamsize>(block.size()));
  return path;
}

bool AllBytesAre(const OwnedFile& f, char fill) {
  for (uint8_t b : f.bytes()) {
    if (b != static_cast<uint8_t>(fill)) return false;
  }
  return true;
}

TEST(FileReadTest, RefusesNonRegularAndOversizedFiles) {
  const std::string fifo = TempDir() + "/fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  auto r = OwnedFile::Read(fifo, 1 << 20);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("a FIFO"));
  r = OwnedFile::Read(TempDir(), 1 << 20);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("a directory"));
  const std::string big = WriteFile("big", 4097, 'x');
  r = OwnedFile::Read(big, 4096);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("more than the limit of 4096"));
  EXPECT_TRUE(OwnedFile::Read(big, 4097).ok());
  EXPECT_EQ(OwnedFile::Read(TempDir() + "/missing", 10).status().code(),
            absl::StatusCode::kNotFound);
  auto empty = OwnedFile::Read(WriteFile("empty", 0, 'x'), 10);
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE((*empty)->bytes().empty());
}

TEST(FileReadTest, ReleasedBufferIsReusedWithTheNextFilesBytesOnly) {
  // Sizes no other test uses, so the pool's best fit is this test's buffer.
  const size_t a_size = (size_t{7} << 20) + 4099;
  const size_t b_size = (size_t{5} << 20) + 17;  // fits: at least half the spare's capacity
  const std::string a = WriteFile("a", a_size, 'a');
  const std::string b = WriteFile("b", b_size, 'b');
  const uint8_t* a_data = nullptr;
  {
    auto fa = OwnedFile::Read(a, int64_t{1} << 30);
    ASSERT_TRUE(fa.ok()) << fa.status();
    EXPECT_TRUE(AllBytesAre(**fa, 'a'));
    a_data = (*fa)->bytes().data();
  }
  auto fb = OwnedFile::Read(b, int64_t{1} << 30);
  ASSERT_TRUE(fb.ok()) << fb.status();
  EXPECT_EQ((*fb)->bytes().data(), a_data);  // the spare, reused
  EXPECT_EQ((*fb)->bytes().size(), b_size);
  EXPECT_TRUE(AllBytesAre(**fb, 'b'));
  // A file of less than half the spare's size gets fresh memory instead.
  fb->reset();
  auto small = OwnedFile::Read(WriteFile("small", size_t{2} << 20, 's'), int64_t{1} << 30);
  ASSERT_TRUE(small.ok());
  EXPECT_NE((*small)->bytes().data(), a_data);
  EXPECT_TRUE(AllBytesAre(**small, 's'));
}

TEST(FileReadTest, ReclaimableSpareIsReusedWithTheNextFilesBytes) {
  SetSpareBuffersReclaimable(true);
  const size_t size = (size_t{13} << 20) + 77;
  const std::string e = WriteFile("e", size, 'e');
  const std::string f = WriteFile("f", size, 'f');
  const uint8_t* e_data = nullptr;
  {
    auto fe = OwnedFile::Read(e, int64_t{1} << 30);
    ASSERT_TRUE(fe.ok()) << fe.status();
    e_data = (*fe)->bytes().data();
  }  // given back MADV_FREE'd: the kernel may drop its pages, which then read as zeros
  auto ff = OwnedFile::Read(f, int64_t{1} << 30);
  SetSpareBuffersReclaimable(false);
  ASSERT_TRUE(ff.ok()) << ff.status();
  EXPECT_EQ((*ff)->bytes().data(), e_data);
  EXPECT_TRUE(AllBytesAre(**ff, 'f'));
}

TEST(FileReadTest, ReservedSpareServesTheFirstRead) {
  const size_t size = (size_t{9} << 20) + 333;
  ReserveSpareBuffers({size, 100});  // the second is below kMinSpareBytes: skipped
  const std::string c = WriteFile("c", size, 'c');
  auto fc = OwnedFile::Read(c, int64_t{1} << 30);
  ASSERT_TRUE(fc.ok()) << fc.status();
  EXPECT_EQ((*fc)->bytes().size(), size);
  EXPECT_TRUE(AllBytesAre(**fc, 'c'));
}

TEST(FileReadTest, DroppedSparesAreUnmapped) {
  const size_t size = (size_t{11} << 20) + 5;
  const std::string d = WriteFile("d", size, 'd');
  uint8_t* first = nullptr;
  {
    auto fd = OwnedFile::Read(d, int64_t{1} << 30);
    ASSERT_TRUE(fd.ok()) << fd.status();
    first = const_cast<uint8_t*>((*fd)->bytes().data());
  }
  unsigned char resident = 0;
  // Released: kept as a spare, still mapped.
  EXPECT_EQ(mincore(first, 4096, &resident), 0);
  DropSpareBuffers();
  // Gone from the process (mincore fails with ENOMEM on an unmapped range).
  EXPECT_EQ(mincore(first, 4096, &resident), -1);
  EXPECT_EQ(errno, ENOMEM);
  auto again = OwnedFile::Read(d, int64_t{1} << 30);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(AllBytesAre(**again, 'd'));
}

// A working copy (a delta's copy of the served weights) takes a spare of its size when the pool
// has one, is faulted in by Prefault (every page resident), and goes back to the pool.
TEST(FileReadTest, PooledBufferReusesASpareAndPrefaultsItsPages) {
  DropSpareBuffers();
  const size_t size = (size_t{15} << 20) + 123;  // a size no other test uses
  uint8_t* first = nullptr;
  {
    auto fresh = PooledBuffer::Take(size);
    ASSERT_TRUE(fresh.ok()) << fresh.status();
    EXPECT_FALSE((*fresh)->reused());
    EXPECT_EQ((*fresh)->size(), size);
    (*fresh)->Prefault();
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    std::vector<unsigned char> resident((size + page - 1) / page);
    ASSERT_EQ(mincore((*fresh)->data(), size, resident.data()), 0);
    EXPECT_TRUE(std::all_of(resident.begin(), resident.end(), [](unsigned char r) {
      return (r & 1) != 0;
    }));  // every page faulted in by Prefault, before anyone writes
    std::memset((*fresh)->data(), 'p', size);
    first = (*fresh)->data();
  }  // back to the pool
  auto again = PooledBuffer::Take(size - 1000);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE((*again)->reused());
  EXPECT_EQ((*again)->data(), first);
  // A file of about that size reuses it too, once given back: one pool for both.
  again->reset();
  const std::string g = WriteFile("g", size, 'g');
  auto fg = OwnedFile::Read(g, int64_t{1} << 30);
  ASSERT_TRUE(fg.ok()) << fg.status();
  EXPECT_EQ((*fg)->bytes().data(), first);
  EXPECT_TRUE(AllBytesAre(**fg, 'g'));
}

TEST(FileReadTest, JsonDepthIsBoundedOutsideStrings) {
  EXPECT_TRUE(CheckJsonDepth("[[1]]", 2, "t").ok());
  EXPECT_FALSE(CheckJsonDepth("[[[1]]]", 2, "t").ok());
  EXPECT_TRUE(CheckJsonDepth(R"(["[[[[", "\"[[["])", 1, "t").ok());
  EXPECT_THAT(std::string(CheckJsonDepth(std::string(100, '{'), 64, "cfg").message()),
              HasSubstr("cfg: JSON nested deeper than 64"));
}

}  // namespace
}  // namespace rl::model_io
