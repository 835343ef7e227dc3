//! CPU pinning for the datapath thread.

use crate::IoError;
use std::io;

/// Pins the calling thread to one CPU with `sched_setaffinity(2)`, so the datapath
/// thread keeps its caches warm and does not bounce between the cores an application uses.
///
/// Fails with [`IoError::Os`] (`EINVAL`) when `cpu` is out of range or not allowed for
/// this process (cgroup cpuset).
pub fn pin_current_thread(cpu: usize) -> Result<(), IoError> {
    // CPU_SET indexes a fixed 1024-bit mask: reject larger numbers instead of overflowing it.
    let max = 8 * std::mem::size_of::<libc::cpu_set_t>();
    if cpu >= max {
        return Err(IoError::Os {
            what: "sched_setaffinity",
            source: io::Error::from_raw_os_error(libc::EINVAL),
        });
    }
    // SAFETY: cpu_set_t is plain bits, all-zero is the empty set; CPU_SET is given an index
    // checked against the mask size above; sched_setaffinity reads `size_of` bytes of `set`.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if rc != 0 {
        return Err(IoError::last_os("sched_setaffinity"));
    }
    Ok(())
}

/// The CPUs the calling thread may run on (`sched_getaffinity(2)`): inside a container,
/// its cpuset.
pub fn allowed_cpus() -> Result<Vec<usize>, IoError> {
    // SAFETY: cpu_set_t is plain bits; sched_getaffinity writes at most `size_of` bytes
    // into it, and CPU_ISSET reads indexes below the mask size.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Err(IoError::last_os("sched_getaffinity"));
        }
        let max = 8 * std::mem::size_of::<libc::cpu_set_t>();
        Ok((0..max).filter(|&c| libc::CPU_ISSET(c, &set)).collect())
    }
}

/// `struct sched_attr` of `sched_setattr(2)` (include/uapi/linux/sched/types.h,
/// `SCHED_ATTR_SIZE_VER1`).
#[repr(C)]
#[derive(Default)]
struct SchedAttr {
    size: u32,
    sched_policy: u32,
    sched_flags: u64,
    sched_nice: i32,
    sched_priority: u32,
    sched_runtime: u64,
    sched_deadline: u64,
    sched_period: u64,
    sched_util_min: u32,
    sched_util_max: u32,
}

/// Asks the scheduler for a short time slice for the calling thread (`SCHED_OTHER`,
/// `sched_runtime` = `slice_ns`), as Linux 6.12's EEVDF allows without privilege: a
/// thread with a shorter slice gets an earlier virtual deadline, so when it wakes it
/// preempts a thread with the default slice (about 3 ms) at once instead of waiting for
/// that slice to end. Kernels before 6.12 accept the call and keep their behaviour.
pub fn request_short_slice(slice_ns: u64) -> Result<(), IoError> {
    let size = std::mem::size_of::<SchedAttr>() as u32;
    let mut attr = SchedAttr::default();
    // SAFETY: sched_getattr writes at most `size` bytes into a live sched_attr; pid 0 is
    // the calling thread; flags 0.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_sched_getattr,
            0,
            &mut attr as *mut SchedAttr,
            size,
            0,
        )
    };
    if rc != 0 {
        return Err(IoError::last_os("sched_getattr"));
    }
    if attr.sched_policy != libc::SCHED_OTHER as u32 {
        // Real-time or batch by the user's choice: not ours to change.
        return Ok(());
    }
    // Only the slice changes (the nice value stays what the process has).
    attr.size = size;
    attr.sched_runtime = slice_ns;
    // SAFETY: sched_setattr reads `attr.size` bytes of a live, initialised sched_attr;
    // pid 0 is the calling thread; flags 0.
    let rc = unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &attr as *const SchedAttr, 0) };
    if rc != 0 {
        return Err(IoError::last_os("sched_setattr"));
    }
    Ok(())
}

/// Lowers the calling thread's nice value to `nice` (a larger scheduler weight), if it
/// is higher and the process may (`CAP_SYS_NICE` or `RLIMIT_NICE`); otherwise leaves it.
///
/// Why, for a thread that sleeps until a packet arrives while application threads spin
/// on every CPU: EEVDF lets a woken thread preempt only if it is *eligible*, and a
/// thread that ran a few microseconds at each of frequent wake-ups goes back to sleep
/// with a small negative lag, so the next wake-up waits for the spinning thread's slice
/// or the tick (milliseconds). A larger weight makes the same run time cost less virtual
/// time, and the lag stays near zero.
pub fn request_nice(nice: i32) -> Result<(), IoError> {
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() } as libc::id_t;
    // getpriority returns the nice value, and -1 is a valid one: errno tells an error.
    // SAFETY: setting errno through the pointer libc gives this thread.
    unsafe { *libc::__errno_location() = 0 };
    // SAFETY: PRIO_PROCESS with a thread ID of this process reads that thread's nice.
    let cur = unsafe { libc::getpriority(libc::PRIO_PROCESS, tid) };
    if cur == -1 && std::io::Error::last_os_error().raw_os_error() != Some(0) {
        return Err(IoError::last_os("getpriority"));
    }
    if cur <= nice {
        return Ok(());
    }
    // SAFETY: as above; only this thread's nice value changes.
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, nice) } != 0 {
        return Err(IoError::last_os("setpriority"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn current_mask() -> Vec<usize> {
        // SAFETY: as above; sched_getaffinity writes at most size_of::<cpu_set_t>() bytes.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            assert_eq!(
                libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set),
                0
            );
            (0..1024).filter(|&c| libc::CPU_ISSET(c, &set)).collect()
        }
    }

    #[test]
    fn pins_to_cpu0_and_rejects_bad_cpu() {
        // Run in a scratch thread so the test harness thread keeps its mask.
        std::thread::spawn(|| {
            pin_current_thread(0).expect("cpu 0 exists");
            assert_eq!(current_mask(), vec![0]);
            let err = pin_current_thread(100_000).unwrap_err();
            assert_eq!(err.raw_os_error(), Some(libc::EINVAL));
            let err = pin_current_thread(1023).unwrap_err();
            assert_eq!(err.raw_os_error(), Some(libc::EINVAL));
            assert_eq!(current_mask(), vec![0], "failed pin leaves the mask alone");
        })
        .join()
        .unwrap();
    }

    /// A new thread lowers its nice value where the process may (it then reads back as
    /// asked, and another call leaves it), and keeps it with an error where it may not.
    #[test]
    fn request_nice_lowers_only_where_allowed() {
        std::thread::spawn(|| {
            // SAFETY: gettid and getpriority of this thread have no preconditions.
            let nice = || unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as _) };
            let before = nice();
            match request_nice(before - 1) {
                Ok(()) => assert_eq!(nice(), before - 1),
                Err(_) => assert_eq!(nice(), before),
            }
            let now = nice();
            request_nice(now + 1).expect("a higher nice than the current one is left alone");
            assert_eq!(nice(), now);
        })
        .join()
        .expect("thread");
    }
}
