//! Running core code with MRI's Global VM Lock released.
//!
//! The core can wait for seconds (a cold start waits up to `cache.cold_start_timeout`,
//! a kick flush up to `kick.exit_wait`); holding the GVL meanwhile would stop every
//! other Ruby thread of the process. Code run here must not touch Ruby: `F: Send`
//! keeps `&Ruby` and Ruby values (neither is `Send`) out of the closure.

use std::any::Any;
use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Why `without_gvl` has no value: the closure panicked, or Ruby had an interrupt
/// pending (a thread switch its timer asked for, a signal, `Thread#raise`) and did
/// not run it; the closure comes back, to run once Ruby has handled the interrupt.
pub enum Failure<F> {
    Panic(Box<dyn Any + Send + 'static>),
    Interrupted(F),
}

/// The closure and its outcome, passed through Ruby as one pointer.
struct Call<F, T> {
    body: Option<F>,
    outcome: Option<std::thread::Result<T>>,
}

/// Runs `body` without the GVL and returns its value. A panic is caught here, on
/// this side of Ruby's frames, and returned.
///
/// `rb_thread_call_without_gvl2` rather than `..._gvl`: the latter checks interrupts
/// after `body` returns and may raise, jumping over Rust frames; the former returns
/// and leaves pending interrupts to Ruby's next check.
pub fn without_gvl<F, T>(body: F) -> Result<T, Failure<F>>
where
    F: FnOnce() -> T + Send,
{
    let mut call = Call { body: Some(body), outcome: None };
    // SAFETY: `trampoline::<F, T>` gets back the pointer to `call`, which outlives
    // the call; no unblocking function, so Ruby never runs anything else on it.
    unsafe {
        rb_sys::rb_thread_call_without_gvl2(
            Some(trampoline::<F, T>),
            &mut call as *mut Call<F, T> as *mut c_void,
            None,
            std::ptr::null_mut(),
        );
    }
    match (call.outcome, call.body) {
        (Some(Ok(value)), _) => Ok(value),
        (Some(Err(panic)), _) => Err(Failure::Panic(panic)),
        (None, Some(body)) => Err(Failure::Interrupted(body)),
        // The trampoline takes the body only to run it; reported, never a panic here.
        (None, None) => Err(Failure::Panic(Box::new("the call neither ran nor came back"))),
    }
}

/// Called by Ruby without the GVL; never unwinds into Ruby.
unsafe extern "C" fn trampoline<F, T>(data: *mut c_void) -> *mut c_void
where
    F: FnOnce() -> T,
{
    // SAFETY: `data` is the `&mut Call<F, T>` that `without_gvl` passed.
    let call = unsafe { &mut *(data as *mut Call<F, T>) };
    if let Some(body) = call.body.take() {
        call.outcome = Some(catch_unwind(AssertUnwindSafe(body)));
    }
    std::ptr::null_mut()
}
