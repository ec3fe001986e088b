#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

extension stat {
    /// When the file's contents last changed, in seconds since 1970 (Darwin's
    /// `struct stat` names the field `st_mtimespec`, glibc's `st_mtim`).
    var modificationTime: time_t {
        #if canImport(Darwin)
        return st_mtimespec.tv_sec
        #else
        return st_mtim.tv_sec
        #endif
    }
}

/// File facts read with `lstat`, spelled once per platform.
enum FileStatus {
    /// When the file at `path` last changed, in seconds since 1970; nil when it
    /// cannot be read.
    static func modificationTime(atPath path: String) -> time_t? {
        var status = stat()
        guard lstat(path, &status) == 0 else { return nil }
        return status.modificationTime
    }
}
