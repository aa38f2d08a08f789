// --store-io: how reads of a file that takes O_DIRECT are sent. kAuto learns per store which is
// faster (cache/backend/io_choice.h); kDirect and kBuffered always go one way.
#pragma once

namespace accelfs {

enum class StoreIo { kAuto, kDirect, kBuffered };

}  // namespace accelfs
