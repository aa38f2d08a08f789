// The one place that decides which errno a failed request answers.
#pragma once

#include <cerrno>

#include "cache/result.h"

namespace accelfs {

inline int ToErrno(Error error) {
  switch (error.code()) {
    case 0:
    case ECANCELED:  // the daemon is shutting down; to the reader it is an I/O error
      return EIO;
    case ENOTCONN:  // the store's own FUSE daemon has died: an I/O error, not this mount's death
      return EIO;
    default:
      return error.code();
  }
}

}  // namespace accelfs
