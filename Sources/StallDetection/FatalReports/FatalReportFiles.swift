#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The file operations of the fatal report, safe in a directory other users can
/// write to: no name another user can predict, no link followed, no open that
/// can block, nothing readable by others.
///
/// Everything happens relative to the report's directory, opened once per
/// operation (`openat`, `renameat`, `unlinkat`): a report path as long as the
/// system takes still works, whatever the temporary name adds to it, and a
/// directory renamed meanwhile cannot send a file elsewhere.
struct FatalReportFiles {
    /// The report's directory, open.
    let directory: Int32
    /// The report's name in it.
    let name: String

    /// Opens the directory of `path` (the working directory for a bare name);
    /// nil when it cannot be opened.
    init?(path: String) {
        let slash = path.lastIndex(of: "/")
        let directoryPath = slash.map { String(path[...$0]) } ?? "."
        name = slash.map { String(path[path.index(after: $0)...]) } ?? path
        guard !name.isEmpty else { return nil }
        directory = open(directoryPath, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard directory >= 0 else { return nil }
    }

    func close() { _ = systemClose(directory) }

    static func closeFile(_ descriptor: Int32) { _ = systemClose(descriptor) }

    /// The longest part of the report's name a temporary name repeats: with the
    /// dots, the random part and `.tmp`, 238 bytes, under the 255 a name can have.
    static let namePrefixLimit = 200

    /// A name beside the report that nobody can predict:
    /// `.<name>.<128 random bits>.tmp`, the report's name cut to
    /// ``namePrefixLimit`` bytes, so that a report whose name is as long as a
    /// name can be still gets a temporary file, and leftovers of a process killed
    /// mid-write can be told apart (``removeLeftovers()``).
    static func temporaryName(for name: String) -> String {
        var generator = SystemRandomNumberGenerator()
        let random = (0..<2).map { _ in
            String(generator.next() as UInt64, radix: 16).leftPadded(to: 16)
        }
        return temporaryPrefix(for: name) + random.joined() + ".tmp"
    }

    private static func temporaryPrefix(for name: String) -> String {
        "." + prefix(of: name, bytes: namePrefixLimit) + "."
    }

    /// The longest start of `text` of at most `bytes` UTF-8 bytes that ends
    /// between two Unicode scalars (found in constant time, whatever the text).
    static func prefix(of text: String, bytes: Int) -> String {
        let utf8 = Array(text.utf8.prefix(bytes + 1))
        guard utf8.count > bytes else { return text }
        var end = bytes
        while end > 0 && utf8[end] & 0xC0 == 0x80 { end -= 1 }  // a continuation byte
        return String(decoding: utf8[..<end], as: UTF8.self)
    }

    /// A new file beside the report, created exclusively (never an object
    /// someone put there, never through a symbolic link, never a blocking open),
    /// mode 0600 whatever the umask; nil when the directory does not take one.
    func createTemporary() -> (descriptor: Int32, name: String)? {
        for _ in 0..<4 {
            let candidate = Self.temporaryName(for: name)
            let descriptor = openat(
                directory, candidate, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0o600)
            if descriptor >= 0 {
                fchmod(descriptor, 0o600)
                return (descriptor, candidate)
            }
            guard errno == EEXIST || errno == EINTR else { return nil }
        }
        return nil
    }

    /// Renames `from` to `to` in the directory; whether it did.
    func rename(_ from: String, to: String) -> Bool { renameat(directory, from, directory, to) == 0 }

    func unlink(_ entry: String) { _ = unlinkat(directory, entry, 0) }

    /// Flushes the directory's entries (a rename) to disk.
    func sync() { _ = fsync(directory) }

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

    /// How old (seconds) a temporary file must be to count as left behind: a
    /// write or a take in progress (another thread's or process's) is younger.
    static let leftoverAge = 60

    /// Removes the temporary files of the report that a process killed while
    /// writing or taking it left behind: this user's regular files with a
    /// temporary name of the report, untouched for ``leftoverAge`` seconds,
    /// never another user's, never a link.
    func removeLeftovers() {
        let namePrefix = Self.temporaryPrefix(for: name)
        let length = namePrefix.utf8.count + 32 + 4
        let copy = dup(directory)
        guard copy >= 0, let stream = fdopendir(copy) else {
            if copy >= 0 { _ = systemClose(copy) }
            return
        }
        defer { closedir(stream) }
        while let entry = readdir(stream) {
            let entryName = ProcessFacts.entryName(entry)
            guard entryName.utf8.count == length, entryName.hasPrefix(namePrefix), entryName.hasSuffix(".tmp")
            else { continue }
            var status = stat()
            guard fstatat(directory, entryName, &status, AT_SYMLINK_NOFOLLOW) == 0,
                status.st_mode & S_IFMT == S_IFREG, status.st_uid == geteuid(),
                time(nil) - status.modificationTime > Self.leftoverAge
            else { continue }
            unlink(entryName)
        }
    }

    /// Takes the report for this caller alone: renames it to a name nobody can
    /// predict, so that of callers taking it at once exactly one succeeds.
    /// Returns the new name, the report's own when the directory refuses the
    /// rename (read-only: the report is read where it is and stays), or nil
    /// when there is nothing to take (nothing there, another caller took it, or
    /// a directory, which is left alone).
    func claim() -> String? {
        var status = stat()
        guard fstatat(directory, name, &status, AT_SYMLINK_NOFOLLOW) == 0, status.st_mode & S_IFMT != S_IFDIR
        else { return nil }
        let claimed = Self.temporaryName(for: name)
        if rename(name, to: claimed) { return claimed }
        switch errno {
        case EACCES, EPERM, EROFS: return name
        default: return nil
        }
    }

    /// The bytes of this user's regular file `entry`, read without blocking and
    /// without following a link; nil for anything else (another user's file, a
    /// link, a FIFO, a socket) or a file larger than `limit`. Removes what it
    /// read; a directory is never removed (one that appeared at a claimed name
    /// goes back to the report's name).
    func readRegularFile(_ entry: String, limit: Int) -> [UInt8]? {
        let descriptor = openat(directory, entry, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW)
        guard descriptor >= 0 else {
            // A symbolic link (its target untouched), a socket, a file this
            // user cannot read: not a report, removed (ENOENT: already gone).
            if errno != ENOENT { unlink(entry) }
            return nil
        }
        var status = stat()
        let kind = fstat(descriptor, &status) == 0 ? status.st_mode & S_IFMT : 0
        // Only this user's writer makes reports: a file of another user's (one
        // planted in a shared directory) is not taken for one.
        guard kind == S_IFREG, status.st_uid == geteuid() else {
            _ = systemClose(descriptor)
            if kind != S_IFDIR {
                unlink(entry)
            } else if entry != name {
                _ = rename(entry, to: name)
            }
            return nil
        }
        let bytes = Self.readAll(descriptor, limit: limit)
        _ = systemClose(descriptor)
        unlink(entry)
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
private let systemClose = Glibc.close
#elseif canImport(Darwin)
private let systemReadFile = Darwin.read
private let systemWriteFile = Darwin.write
private let systemClose = Darwin.close
#endif
