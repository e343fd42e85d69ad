//! Where io_uring cannot be set up (seccomp in containers, kernel.io_uring_disabled), the
//! runtime falls back to epoll, says so in exactly one line, and still works. The test denies
//! io_uring_setup with a seccomp filter in a child process (the filter cannot be removed, so it
//! must not touch the other tests) and reads the child's stderr.

use std::process::Command;

use barewire_engine::net::{TcpListener, TcpStream};
use barewire_engine::{Reactor, ReactorKind, Runtime};

const CHILD: &str = "BAREWIRE_TEST_NO_IO_URING_CHILD";

/// Makes io_uring_setup fail with EPERM for this thread and the threads it starts.
fn deny_io_uring() {
    #[repr(C)]
    struct SockFilter {
        code: u16,
        jt: u8,
        jf: u8,
        k: u32,
    }
    #[repr(C)]
    struct SockFprog {
        len: u16,
        filter: *const SockFilter,
    }
    const BPF_LD_W_ABS: u16 = 0x20;
    const BPF_JEQ_K: u16 = 0x15;
    const BPF_RET_K: u16 = 0x06;
    const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
    const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
    let prog = [
        SockFilter {
            code: BPF_LD_W_ABS,
            jt: 0,
            jf: 0,
            k: 0,
        }, // seccomp_data.nr
        SockFilter {
            code: BPF_JEQ_K,
            jt: 0,
            jf: 1,
            k: libc::SYS_io_uring_setup as u32,
        },
        SockFilter {
            code: BPF_RET_K,
            jt: 0,
            jf: 0,
            k: SECCOMP_RET_ERRNO | libc::EPERM as u32,
        },
        SockFilter {
            code: BPF_RET_K,
            jt: 0,
            jf: 0,
            k: SECCOMP_RET_ALLOW,
        },
    ];
    let fprog = SockFprog {
        len: prog.len() as u16,
        filter: prog.as_ptr(),
    };
    // SAFETY: standard seccomp filter installation; no_new_privs first, as seccomp(2) requires.
    unsafe {
        assert_eq!(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0);
        assert_eq!(
            libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER,
                &fprog as *const SockFprog
            ),
            0
        );
    }
}

fn child() {
    deny_io_uring();
    // Explicitly asking for io_uring is an error that says what to do.
    let e = Runtime::builder()
        .cores(1)
        .pin(false)
        .reactor(Reactor::IoUring)
        .build()
        .err()
        .expect("io_uring denied");
    assert!(e.to_string().contains("epoll"), "{e}");
    for _ in 0..3 {
        let rt = Runtime::builder()
            .cores(2)
            .sleeping()
            .reactor(Reactor::Auto)
            .build()
            .unwrap();
        assert_eq!(rt.reactor(), ReactorKind::Epoll);
        rt.block_on(async {
            let l = TcpListener::bind("127.0.0.1:0".parse().unwrap()).unwrap();
            let c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
            let (s, _) = l.accept().await.unwrap();
            c.write_all(b"fallback".to_vec()).await.0.unwrap();
            let (r, got) = s.read_exact(vec![0u8; 8]).await;
            r.unwrap();
            assert_eq!(&got, b"fallback");
        });
    }
    println!("CHILD-OK");
}

#[test]
fn without_io_uring_the_epoll_reactor_takes_over_with_one_warning() {
    if std::env::var_os(CHILD).is_some() {
        return child();
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "without_io_uring_the_epoll_reactor_takes_over_with_one_warning",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .env_remove("BAREWIRE_REACTOR")
        .env_remove("BAREWIRE_SQPOLL")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("CHILD-OK"),
        "child failed:\n{stdout}\n{stderr}"
    );
    let warnings = stderr
        .lines()
        .filter(|l| l.contains("the epoll reactor is active"))
        .count();
    assert_eq!(
        warnings, 1,
        "exactly one warning for three runtimes of two cores:\n{stderr}"
    );
}
