//! The plugin stays loaded once it has counted a communicator. NCCL closes its
//! profiler plugin when its count of communicators reaches zero (`profiler.cc`,
//! `ncclProfilerPluginUnload`), and reads its table pointer without a lock; NCCL's
//! newer init paths can also close it twice on one failed init. A call into a closed
//! library is a SIGSEGV in the user's job, and the plugin's mappings and contexts
//! (kept for NCCL's late events) would go with it: marking the library
//! RTLD_NODELETE once costs nothing.

use std::ffi::{c_void, CStr};
use std::sync::Once;

static PINNED: Once = Once::new();

/// Marks the library holding this code as never to be unloaded (once).
pub fn pin() {
    PINNED.call_once(|| unsafe {
        let mut info: libc::Dl_info = std::mem::zeroed();
        let here = pin as *const c_void;
        if libc::dladdr(here, &mut info) == 0 || info.dli_fname.is_null() {
            return;
        }
        // NOLOAD: only the library already loaded; the handle's reference is kept.
        let flags = libc::RTLD_NOW | libc::RTLD_NOLOAD | libc::RTLD_NODELETE;
        let _ = libc::dlopen(CStr::from_ptr(info.dli_fname).as_ptr(), flags);
    });
}
