#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The file operations of the fatal report, safe in a directory other users can
/// write to: no name another user can predict, no link followed, no open that
/// can block, nothing readable by others.
enum FatalReportFiles {
    /// A name beside `path` (in its directory) that nobody can predict:
    /// `.<name>.<128 random bits>.tmp`, the report's name cut to
    /// ``namePrefixLimit`` bytes, so that a report whose name is as long as a
    /// name can be still gets a temporary file, and leftovers of a process killed
    /// mid-write can be told apart (``removeLeftovers(beside:)``).
    static func temporaryPath(beside path: String) -> String {
        var generator = SystemRandomNumberGenerator()
        let random = (0..<2).map { _ in
            String(generator.next() as UInt64, radix: 16).leftPadded(to: 16)
        }
        return temporaryPrefix(of: path) + random.joined() + ".tmp"
    }

    /// The longest part of the report's name a temporary name repeats: with the
    /// dots, the random part and `.tmp`, 238 bytes, under the 255 a name can have.
    static let namePrefixLimit = 200

    /// The directory and the start of every temporary name of `path`.
    private static func temporaryPrefix(of path: String) -> String {
        let slash = path.lastIndex(of: "/")
        let directory = slash.map { String(path[...$0]) } ?? ""
        let name = slash.map { path[path.index(after: $0)...] } ?? path[...]
        var end = name.utf8.index(name.utf8.startIndex, offsetBy: min(name.utf8.count, namePrefixLimit))
        while String.Index(end, within: name) == nil { end = name.utf8.index(before: end) }
        return directory + "." + name[..<end] + "."
    }

    /// Removes the temporary files of `path` that a process killed while writing
    /// or taking the report left behind: this user's regular files with a
    /// temporary name of `path`, never another user's, never a link.
    static func removeLeftovers(beside path: String) {
        let prefix = temporaryPrefix(of: path)
        let slash = prefix.lastIndex(of: "/")
        let directory = slash.map { String(prefix[...$0]) } ?? "./"
        let namePrefix = String(slash.map { prefix[prefix.index(after: $0)...] } ?? prefix[...])
        guard let stream = opendir(directory) else { return }
        defer { closedir(stream) }
        let length = namePrefix.utf8.count + 32 + 4
        while let entry = readdir(stream) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                String(decoding: raw.prefix { $0 != 0 }, as: UTF8.self)
            }
            guard name.utf8.count == length, name.hasPrefix(namePrefix), name.hasSuffix(".tmp") else { continue }
            var status = stat()
            let candidate = directory + name
            guard lstat(candidate, &status) == 0, status.st_mode & S_IFMT == S_IFREG, status.st_uid == geteuid()
            else { continue }
            unlink(candidate)
        }
    }

    /// A new file beside `path`, created exclusively (never an object someone
    /// put there, never through a symbolic link, never a blocking open), mode
    /// 0600 whatever the umask; nil when the directory does not take one.
    static func createTemporary(beside path: String) -> (descriptor: Int32, path: String)? {
        for _ in 0..<4 {
            let candidate = temporaryPath(beside: path)
            let descriptor = open(
                candidate, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0o600)
            if descriptor >= 0 {
                fchmod(descriptor, 0o600)
                return (descriptor, candidate)
            }
            guard errno == EEXIST || errno == EINTR else { return nil }
        }
        return nil
    }

    /// Writes all of `bytes`; false when the file took less.
    static func writeAll(_ bytes: [UInt8], to descriptor: Int32) -> Bool {
        var written = 0
        while written < bytes.count {
            let count = bytes.withUnsafeBytes { raw in
                systemWriteFile(descriptor, raw.baseAddress! + written, raw.count - written)
            }
            if count < 0 && errno == EINTR { continue }
            guard count > 0 else { return false }
            written += count
        }
        return true
    }

    /// Flushes the directory entry of a rename to disk.
    static func syncDirectory(of path: String) {
        let directory = path.lastIndex(of: "/").map { String(path[...$0]) } ?? "."
        let descriptor = open(directory, O_RDONLY | O_DIRECTORY | O_NONBLOCK | O_CLOEXEC)
        guard descriptor >= 0 else { return }
        fsync(descriptor)
        close(descriptor)
    }

    /// Takes the object at `path` for this caller alone: renames it to a name
    /// nobody can predict, so that of callers taking it at once exactly one
    /// succeeds. Returns the new name, `path` itself when the directory refuses
    /// the rename (read-only: the report is read where it is and stays), or nil
    /// when there is nothing to take (nothing there, another caller took it, or
    /// a directory, which is left alone).
    static func claim(_ path: String) -> String? {
        var status = stat()
        guard lstat(path, &status) == 0, status.st_mode & S_IFMT != S_IFDIR else { return nil }
        let claimed = temporaryPath(beside: path)
        if rename(path, claimed) == 0 { return claimed }
        switch errno {
        case EACCES, EPERM, EROFS: return path
        default: return nil
        }
    }

    /// The bytes of the regular file at `path`, read without blocking and
    /// without following a link; nil for anything else or a file larger than
    /// `limit`. Removes what it read; a directory is never removed (one that
    /// appeared at a claimed name goes back to `original`).
    static func readRegularFile(at path: String, limit: Int, original: String) -> [UInt8]? {
        let descriptor = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW)
        guard descriptor >= 0 else {
            if errno == ELOOP { unlink(path) }  // a symbolic link: removed, its target untouched
            return nil
        }
        var status = stat()
        let kind = fstat(descriptor, &status) == 0 ? status.st_mode & S_IFMT : 0
        guard kind == S_IFREG else {
            close(descriptor)
            if kind != S_IFDIR {
                unlink(path)
            } else if path != original {
                rename(path, original)
            }
            return nil
        }
        let bytes = readAll(descriptor, limit: limit)
        close(descriptor)
        unlink(path)
        return bytes
    }

    private static func readAll(_ descriptor: Int32, limit: Int) -> [UInt8]? {
        var bytes: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 65_536)
        while true {
            let count = buffer.withUnsafeMutableBytes { systemReadFile(descriptor, $0.baseAddress, $0.count) }
            if count < 0 && errno == EINTR { continue }
            if count < 0 { return nil }
            if count == 0 { return bytes }
            bytes += buffer.prefix(count)
            if bytes.count > limit { return nil }
        }
    }
}

#if canImport(Glibc)
private let systemReadFile = Glibc.read
private let systemWriteFile = Glibc.write
#elseif canImport(Darwin)
private let systemReadFile = Darwin.read
private let systemWriteFile = Darwin.write
#endif
