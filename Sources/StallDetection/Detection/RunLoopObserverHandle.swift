import SafeTimers

#if canImport(CoreFoundation)
import CoreFoundation
// On Linux the Core Foundation symbols live in Foundation's library.
import Foundation
#endif

/// A run-loop observer on the main run loop that reports each activity as it
/// happens: `idle` when the loop is about to sleep (or exits), busy otherwise.
///
/// `@unchecked Sendable` invariant: the wrapped `CFRunLoopObserver` is created in
/// `init` and only ever passed to `CFRunLoopRemoveObserver` and
/// `CFRunLoopObserverInvalidate`, which Core Foundation documents as thread-safe;
/// nothing else touches it.
final class RunLoopObserverHandle: @unchecked Sendable {
    #if canImport(CoreFoundation)
    private let observer: CFRunLoopObserver?
    #endif

    init(onActivity: @escaping @Sendable (_ idle: Bool) -> Void) {
        #if canImport(CoreFoundation)
        observer = CFRunLoopObserverCreateWithHandler(
            kCFAllocatorDefault, CFRunLoopActivity.allActivities.rawValue, true, 0
        ) { _, activity in
            let idle = activity == .beforeWaiting || activity == .exit
            onActivity(idle)
        }
        if let observer {
            CFRunLoopAddObserver(CFRunLoopGetMain(), observer, kCFRunLoopCommonModes)
        }
        #endif
    }

    /// Whether the calling thread is the main thread inside a pass of the main
    /// run loop (a handler the loop called, such as an app's launch): the loop is
    /// busy now, and the observer will see the end of this pass, not its start.
    static var isInMainRunLoopPass: Bool {
        #if canImport(CoreFoundation)
        guard ThreadIdentity.isMainThread else { return false }
        return CFRunLoopCopyCurrentMode(CFRunLoopGetMain()) != nil
        #else
        return false
        #endif
    }

    /// Removes the observer from the main run loop; after it returns no callback
    /// begins.
    func remove() {
        #if canImport(CoreFoundation)
        if let observer {
            CFRunLoopRemoveObserver(CFRunLoopGetMain(), observer, kCFRunLoopCommonModes)
            CFRunLoopObserverInvalidate(observer)
        }
        #endif
    }
}
