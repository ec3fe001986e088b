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
