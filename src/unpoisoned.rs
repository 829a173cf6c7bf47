//! A `Mutex` lock that ignores poisoning: locking that survives a panic elsewhere.

use std::sync::{Mutex, MutexGuard};

/// Locks, ignoring poisoning. Every critical section in the core leaves its data
/// whole (a panic there is caught and reported, not half-applied), so a poisoned
/// lock only means another thread panicked: the data is still usable.
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
