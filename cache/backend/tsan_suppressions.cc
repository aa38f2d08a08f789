// ThreadSanitizer's built-in suppressions, linked into every executable of a -fsanitize=thread
// build (CMakeLists.txt, accelfs_target).
//
// libtorrent comes from Debian, not built with ThreadSanitizer: of its memory accesses the
// sanitizer sees only those made through libc (memcpy, memset), and none of its atomics, such as
// the reference counts of the shared_ptrs it holds. A torrent_handle call (status()) holds the
// torrent alive while the engine's thread removes it, so the caller's thread can drop the last
// reference and free the torrent_info, which the engine's thread had copied from with memcpy:
// the release that orders the two is an atomic decrement inside libtorrent, invisible here, and
// the free is reported as a race (4 runs in 6 of
// SwarmReaderTest.AChunkWhoseHolderDiedIsReadAgainByOneNodeNotByEach). called_from_lib makes
// libtorrent's libc calls as invisible as the rest of its accesses; its locks stay visible, and
// every access of accelfs's own code, including the disk interface that libtorrent's threads
// call, is still checked.

extern "C" const char* __tsan_default_suppressions() {
  return "called_from_lib:libtorrent-rasterbar.so\n";
}
