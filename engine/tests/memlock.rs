//! A locked-memory limit too small for a registered pool is a clear error that names
//! RLIMIT_MEMLOCK and the size needed. Its own test binary, because it lowers the limit and
//! drops CAP_IPC_LOCK for the whole process.

use barewire_engine::pool::BufferPool;
use barewire_engine::{Error, Runtime};

/// Drops CAP_IPC_LOCK from the effective set (root has it, and it lifts the limit).
fn drop_ipc_lock() {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const V3: u32 = 0x2008_0522;
    let mut h = Header {
        version: V3,
        pid: 0,
    };
    let mut d = [Data::default(); 2];
    // SAFETY: capget with a v3 header and two data words, as capget(2) specifies.
    let rc = unsafe { libc::syscall(libc::SYS_capget, &mut h as *mut Header, d.as_mut_ptr()) };
    assert_eq!(rc, 0, "capget");
    d[0].effective &= !(1 << 14); // CAP_IPC_LOCK
                                  // SAFETY: capset with the same structures, clearing one effective bit.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &mut h as *mut Header, d.as_ptr()) };
    assert_eq!(rc, 0, "capset");
}

#[test]
fn a_small_memlock_limit_is_reported_with_the_size_needed() {
    drop_ipc_lock();
    let lim = libc::rlimit {
        rlim_cur: 64 * 1024,
        rlim_max: libc::RLIM_INFINITY,
    };
    let mut old = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: get/set our own process's limit.
    unsafe {
        libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut old);
        let lim = libc::rlimit {
            rlim_max: old.rlim_max,
            ..lim
        };
        assert_eq!(libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim), 0);
    }
    let rt = Runtime::builder().cores(1).pin(false).build().unwrap();
    rt.block_on(async {
        match BufferPool::new(64, 64 * 1024) {
            Err(e @ Error::Memlock { needed, limit }) => {
                assert_eq!(needed, 64 * 64 * 1024);
                assert_eq!(limit, 64 * 1024);
                let msg = e.to_string();
                assert!(
                    msg.contains("RLIMIT_MEMLOCK") && msg.contains("4194304"),
                    "{msg}"
                );
            }
            Err(e) => panic!("wrong error: {e}"),
            Ok(_) => panic!("4 MiB registered under a 64 KiB memlock limit"),
        }
        // A pool that fits still works.
        let small = BufferPool::new(4, 4096).expect("16 KiB fits in 64 KiB");
        assert_eq!(small.available(), 4);
    });
}
