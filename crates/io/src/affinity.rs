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
}
