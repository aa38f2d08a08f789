// The swarm engine's storage (cache/backend/swarm_engine.cc includes it, and nothing else): each
// torrent's ChunkData in memory, behind libtorrent's disk interface. A header of that file only:
// it includes libtorrent, which stays behind the engine's seam.
#pragma once

#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <libtorrent/disk_interface.hpp>
#include <libtorrent/hasher.hpp>
#include <libtorrent/storage_defs.hpp>

#include "cache/backend/swarm_chunk.h"
#include "cache/mutex.h"

namespace accelfs::swarm_disk {

// Chunk data handed to the engine before its torrent is added, by info-hash: the disk takes it
// when the engine creates the torrent's storage (on the engine's thread).
class Registry {
 public:
  void Put(const lt::sha1_hash& hash, std::shared_ptr<ChunkData> data) {
    MutexLock lock(mu_);
    pending_[hash] = std::move(data);
  }
  std::shared_ptr<ChunkData> Take(const lt::sha1_hash& hash) {
    MutexLock lock(mu_);
    const auto it = pending_.find(hash);
    if (it == pending_.end()) return nullptr;
    std::shared_ptr<ChunkData> data = std::move(it->second);
    pending_.erase(it);
    return data;
  }

 private:
  Mutex mu_;
  std::map<lt::sha1_hash, std::shared_ptr<ChunkData>> pending_ ACCELFS_GUARDED_BY(mu_);
};

// The engine's storage: each torrent's ChunkData, in memory. Called on the engine's network
// thread; handlers are posted back to it.
class MemoryDisk final : public lt::disk_interface, public lt::buffer_allocator_interface {
 public:
  MemoryDisk(lt::io_context& ioc, std::shared_ptr<Registry> registry)
      : ioc_(ioc), registry_(std::move(registry)) {}

  lt::storage_holder new_torrent(const lt::storage_params& params,
                                 const std::shared_ptr<void>&) override {
    std::shared_ptr<ChunkData> data = registry_->Take(params.info_hash);
    if (!data) {
      data = std::make_shared<ChunkData>(static_cast<uint64_t>(params.files.total_size()),
                                         static_cast<uint32_t>(params.files.piece_length()));
    }
    auto index = lt::storage_index_t(static_cast<std::uint32_t>(storages_.size()));
    if (!free_.empty()) {
      index = free_.back();
      free_.pop_back();
      storages_[static_cast<size_t>(static_cast<int>(index))] = std::move(data);
    } else {
      storages_.push_back(std::move(data));
    }
    return lt::storage_holder(index, *this);
  }
  void remove_torrent(lt::storage_index_t index) override {
    storages_[Slot(index)].reset();
    free_.push_back(index);
  }

  void async_read(lt::storage_index_t storage, const lt::peer_request& r,
                  std::function<void(lt::disk_buffer_holder, const lt::storage_error&)> handler,
                  lt::disk_job_flags_t) override {
    lt::storage_error error;
    char* copy = nullptr;
    ChunkData* data = storages_[Slot(storage)].get();
    const int piece = static_cast<int>(r.piece);
    std::byte* bytes = data != nullptr ? data->Existing(piece) : nullptr;
    if (bytes == nullptr || r.start < 0 || r.length <= 0 ||
        static_cast<uint64_t>(r.start) + static_cast<uint64_t>(r.length) > data->PieceSize(piece)) {
      error.ec = boost::asio::error::eof;
      error.operation = lt::operation_t::file_read;
    } else {
      copy = new char[static_cast<size_t>(r.length)];  // the send buffer owns a copy
      std::memcpy(copy, bytes + r.start, static_cast<size_t>(r.length));
    }
    const int length = copy != nullptr ? r.length : 0;
    post(ioc_, [this, handler = std::move(handler), error, copy, length] {
      handler(lt::disk_buffer_holder(*this, copy, length), error);
    });
  }

  bool async_write(lt::storage_index_t storage, const lt::peer_request& r, const char* buf,
                   std::shared_ptr<lt::disk_observer>,
                   std::function<void(const lt::storage_error&)> handler,
                   lt::disk_job_flags_t) override {
    lt::storage_error error;
    ChunkData* data = storages_[Slot(storage)].get();
    if (data == nullptr || r.start < 0 || r.length <= 0 ||
        !data->Write(static_cast<int>(r.piece), static_cast<uint64_t>(r.start), buf,
                     static_cast<uint64_t>(r.length))) {
      error.ec = boost::asio::error::no_memory;
      error.operation = lt::operation_t::file_write;
    }
    post(ioc_, [handler = std::move(handler), error] { handler(error); });
    return false;
  }

  // On the engine's network thread. (Hashing on threads of its own measured 1.12x the rate,
  // within this VM's noise, and its answer handed back through libtorrent's io_context is a
  // hand-off ThreadSanitizer cannot see: docs/BENCHMARKS.md, "Issue 51, second stop".)
  void async_hash(
      lt::storage_index_t storage, lt::piece_index_t piece, lt::span<lt::sha256_hash>,
      lt::disk_job_flags_t,
      std::function<void(lt::piece_index_t, const lt::sha1_hash&, const lt::storage_error&)>
          handler) override {
    lt::storage_error error;
    lt::sha1_hash hash;
    ChunkData* data = storages_[Slot(storage)].get();
    const int p = static_cast<int>(piece);
    std::byte* bytes = data != nullptr ? data->Existing(p) : nullptr;
    if (bytes == nullptr) {
      error.ec = boost::asio::error::eof;
      error.operation = lt::operation_t::file_read;
    } else {
      hash = lt::hasher(reinterpret_cast<const char*>(bytes), static_cast<int>(data->PieceSize(p)))
                 .final();
    }
    post(ioc_, [handler = std::move(handler), piece, hash, error] { handler(piece, hash, error); });
  }
  void async_hash2(
      lt::storage_index_t, lt::piece_index_t piece, int, lt::disk_job_flags_t,
      std::function<void(lt::piece_index_t, const lt::sha256_hash&, const lt::storage_error&)>
          handler) override {
    // v1 torrents only: never asked.
    lt::storage_error error;
    error.ec = boost::asio::error::operation_not_supported;
    post(ioc_, [handler = std::move(handler), piece, error] {
      handler(piece, lt::sha256_hash(), error);
    });
  }
  void async_move_storage(
      lt::storage_index_t, std::string path, lt::move_flags_t,
      std::function<void(lt::status_t, const std::string&, const lt::storage_error&)> handler)
      override {
    lt::storage_error error;
    error.ec = boost::asio::error::operation_not_supported;
    post(ioc_, [handler = std::move(handler), path, error] {
      handler(lt::status_t::fatal_disk_error, path, error);
    });
  }
  void async_release_files(lt::storage_index_t, std::function<void()> handler) override {
    if (handler) post(ioc_, std::move(handler));
  }
  void async_check_files(
      lt::storage_index_t, const lt::add_torrent_params*,
      lt::aux::vector<std::string, lt::file_index_t>,
      std::function<void(lt::status_t, const lt::storage_error&)> handler) override {
    post(ioc_,
         [handler = std::move(handler)] { handler(lt::status_t::no_error, lt::storage_error()); });
  }
  void async_stop_torrent(lt::storage_index_t, std::function<void()> handler) override {
    if (handler) post(ioc_, std::move(handler));
  }
  void async_rename_file(
      lt::storage_index_t, lt::file_index_t index, std::string name,
      std::function<void(const std::string&, lt::file_index_t, const lt::storage_error&)> handler)
      override {
    post(ioc_, [handler = std::move(handler), name, index] {
      handler(name, index, lt::storage_error());
    });
  }
  void async_delete_files(lt::storage_index_t, lt::remove_flags_t,
                          std::function<void(const lt::storage_error&)> handler) override {
    post(ioc_, [handler = std::move(handler)] { handler(lt::storage_error()); });
  }
  void async_set_file_priority(
      lt::storage_index_t, lt::aux::vector<lt::download_priority_t, lt::file_index_t> prio,
      std::function<void(const lt::storage_error&,
                         lt::aux::vector<lt::download_priority_t, lt::file_index_t>)>
          handler) override {
    post(ioc_, [handler = std::move(handler), prio = std::move(prio)]() mutable {
      handler(lt::storage_error(), std::move(prio));
    });
  }
  void async_clear_piece(lt::storage_index_t, lt::piece_index_t index,
                         std::function<void(lt::piece_index_t)> handler) override {
    post(ioc_, [handler = std::move(handler), index] { handler(index); });
  }
  void update_stats_counters(lt::counters&) const override {}
  std::vector<lt::open_file_state> get_status(lt::storage_index_t) const override { return {}; }
  void abort(bool) override {}
  void submit_jobs() override {}
  void settings_updated() override {}

  void free_disk_buffer(char* buffer) override { delete[] buffer; }

 private:
  static size_t Slot(lt::storage_index_t index) {
    return static_cast<size_t>(static_cast<std::uint32_t>(index));
  }

  lt::io_context& ioc_;
  std::shared_ptr<Registry> registry_;
  std::vector<std::shared_ptr<ChunkData>> storages_;  // the engine's thread only
  std::vector<lt::storage_index_t> free_;
};

}  // namespace accelfs::swarm_disk
