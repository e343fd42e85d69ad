//! Helpers the workspace's tests share (see the README): the one-core sleeping runtime, child
//! processes that announce `READY <port>`, network namespaces joined by a veth pair, a higher
//! descriptor limit for flood tests, and the address of an shm listener's name.

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use barewire_engine::Runtime;

/// How long a child has to say `READY <port>`.
pub const READY_WAIT: Duration = Duration::from_secs(30);

/// One core that sleeps when idle: test binaries run in parallel on two CPUs, and a core that
/// spins would take one from its neighbours.
pub fn rt() -> Runtime {
    Runtime::builder()
        .cores(1)
        .sleeping()
        .build()
        .expect("a one-core runtime")
}

/// A child process whose first line on standard output is `READY <port>`. Dropping it sends
/// `SIGCONT` (it may be stopped), kills it and reaps it.
///
/// ```
/// use std::process::Command;
/// use barewire_test_support::ReadyChild;
/// let peer = ReadyChild::spawn(Command::new("sh").args(["-c", "echo READY 7000; exec sleep 9"]));
/// assert_eq!(peer.port(), 7000);
/// peer.signal(libc::SIGSTOP); // paused; dropping it continues, kills and reaps it
/// ```
pub struct ReadyChild {
    child: Child,
    port: u16,
    /// The rest of its standard output, for tests that read on.
    pub stdout: BufReader<ChildStdout>,
}

impl ReadyChild {
    /// Starts `cmd` with standard output piped and waits (up to [`READY_WAIT`]) for its
    /// `READY <port>` line; panics, saying what it printed instead, when that does not come.
    pub fn spawn(cmd: &mut Command) -> ReadyChild {
        let mut child = cmd
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {cmd:?}: {e}"));
        let (port, stdout) = read_ready(&mut child, cmd);
        ReadyChild {
            child,
            port,
            stdout,
        }
    }

    /// The port it announced.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its process id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Sends it `sig` (`libc::SIGSTOP`, `SIGKILL`, ...).
    pub fn signal(&self, sig: i32) {
        // SAFETY: signalling our own child, which is not reaped before Drop.
        let rc = unsafe { libc::kill(self.child.id() as i32, sig) };
        assert_eq!(rc, 0, "kill({}, {sig})", self.child.id());
    }

    /// Waits for it to exit.
    pub fn wait(&mut self) -> std::process::ExitStatus {
        self.child.wait().expect("waiting for a child")
    }
}

impl Drop for ReadyChild {
    fn drop(&mut self) {
        // SAFETY: signalling our own child (a no-op error if it has exited already).
        unsafe { libc::kill(self.child.id() as i32, libc::SIGCONT) };
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Reads `READY <port>` from `child`'s piped standard output, on a helper thread so that a
/// child that never says it cannot hang the test.
fn read_ready(child: &mut Child, cmd: &Command) -> (u16, BufReader<ChildStdout>) {
    let out = child.stdout.take().expect("standard output piped");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut out = BufReader::new(out);
        let mut line = String::new();
        let r = out.read_line(&mut line);
        let _ = tx.send((r.map(|_| line), out));
    });
    let (line, out) = match rx.recv_timeout(READY_WAIT) {
        Ok((Ok(line), out)) => (line, out),
        Ok((Err(e), _)) => panic!("{cmd:?}: reading its output: {e}"),
        Err(_) => {
            let _ = child.kill();
            panic!("{cmd:?} did not say READY within {READY_WAIT:?}")
        }
    };
    let port = line
        .trim()
        .strip_prefix("READY ")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("{cmd:?} said {line:?}, not READY <port>"));
    (port, out)
}

/// A network namespace joined to this one by a veth pair; removed on drop.
pub struct Netns {
    pub name: String,
    pub veth: String,
}

impl Netns {
    pub fn ip(args: &[&str]) -> bool {
        Command::new("ip")
            .args(args)
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    }

    /// A namespace joined to this one by a veth pair: (namespace, host-side address,
    /// namespace-side address), in a /30 of 10.234.0.0/16.
    pub fn create() -> Option<(Netns, String, String)> {
        Netns::create_in(234)
    }

    /// As [`create_in`](Self::create_in), for a test that needs the namespace: `None`, with a
    /// SKIP line, where namespaces cannot be made (no root, no iproute2), except under CI
    /// (`CI=true`), where that fails the test.
    pub fn for_test(b: u8) -> Option<(Netns, String, String)> {
        let made = Netns::create_in(b);
        if made.is_none() {
            if std::env::var("CI").as_deref() == Ok("true") {
                panic!("network namespaces are unavailable under CI (needs root and iproute2)");
            }
            eprintln!("SKIP: cannot create a network namespace here (needs root and iproute2)");
        }
        made
    }

    /// As `create`, in a /30 of 10.`b`.0.0/16 (tests that may run at the same time as others'
    /// namespaces take a range of their own).
    pub fn create_in(b: u8) -> Option<(Netns, String, String)> {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        // A subnet no interface has yet: a namespace left behind by a test run that was killed
        // (its Drop never ran) keeps its addresses, and a second veth in the same subnet
        // would break this one's routes.
        let id = loop {
            let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let id = std::process::id() % 10_000 * 10 + n % 10;
            let subnet = format!("10.{b}.{}.0/30", id % 200 + 20);
            let used = Command::new("ip")
                .args(["-o", "addr", "show", "to", &subnet])
                .output()
                .map(|o| !o.stdout.is_empty())
                .unwrap_or(false);
            if !used || n >= 200 {
                break id;
            }
        };
        let (name, veth, inner) = (
            format!("bw{b}n{id}"),
            format!("bw{b}a{id}"),
            format!("bw{b}b{id}"),
        );
        let net = id % 200 + 20;
        let (host, peer) = (format!("10.{b}.{net}.1"), format!("10.{b}.{net}.2"));
        let ns = Netns {
            name: name.clone(),
            veth: veth.clone(),
        };
        let exec = |args: &[&str]| {
            let mut v = vec!["netns", "exec", &name];
            v.extend_from_slice(args);
            Netns::ip(&v)
        };
        let ok = Netns::ip(&["netns", "add", &name])
            && Netns::ip(&["link", "add", &veth, "type", "veth", "peer", "name", &inner])
            && Netns::ip(&["link", "set", &inner, "netns", &name])
            && Netns::ip(&["addr", "add", &format!("{host}/30"), "dev", &veth])
            && Netns::ip(&["link", "set", &veth, "up"])
            && exec(&["ip", "addr", "add", &format!("{peer}/30"), "dev", &inner])
            && exec(&["ip", "link", "set", &inner, "up"])
            && exec(&["ip", "link", "set", "lo", "up"]);
        ok.then_some((ns, host, peer))
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        Netns::ip(&["link", "del", &self.veth]);
        Netns::ip(&["netns", "del", &self.name]);
    }
}

/// Raises this process's descriptor limit to `n` if it is lower (a flood test opens a thousand
/// sockets on each side); false if the hard limit forbids it.
pub fn allow_fds(n: u64) -> bool {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit on a local struct.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        if lim.rlim_cur >= n {
            return true;
        }
        if lim.rlim_max < n {
            return false;
        }
        lim.rlim_cur = n;
        libc::setrlimit(libc::RLIMIT_NOFILE, &lim) == 0
    }
}

/// The abstract Unix address (and its length) of the shm listener of 127.0.0.1:`port`, as the
/// drivers' shm backend names it: for tests that connect to it, or take it first, by hand.
pub fn shm_listener_address(port: u16) -> (libc::sockaddr_un, libc::socklen_t) {
    // SAFETY: sockaddr_un is plain data; all zeros is a valid value.
    let mut a: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    a.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let name = format!("barewire-shm/127.0.0.1:{port}");
    // sun_path[0] stays 0: the abstract namespace.
    for (i, b) in name.bytes().enumerate() {
        a.sun_path[1 + i] = b as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + 1 + name.len();
    (a, len as libc::socklen_t)
}

/// A process of user `nobody` (65534) that holds the shm name of 127.0.0.1:`port`, as any
/// local user can (abstract names have no owner), until dropped. `None` where this test cannot
/// change users (not root).
pub struct Squatter {
    pid: libc::pid_t,
}

/// Forks a [`Squatter`] on `port`'s shm name and waits until it holds it; `None` unless this
/// process runs as root.
pub fn squat(port: u16) -> Option<Squatter> {
    use std::os::fd::{FromRawFd, OwnedFd};
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    // Everything the child needs is made before the fork: it only makes system calls.
    let (a, len) = shm_listener_address(port);
    let mut ready = [0; 2];
    // SAFETY: a pipe into a local array; checked.
    assert_eq!(unsafe { libc::pipe(ready.as_mut_ptr()) }, 0);
    // SAFETY: the child makes only async-signal-safe system calls on memory made above, and
    // leaves with _exit.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: as above.
        unsafe {
            // The child has a copy of every descriptor the test process had at the fork,
            // other tests' sockets among them (tests run on threads): it keeps only the pipe's
            // write end (as descriptor 3), so that it holds no port another test binds again.
            if libc::dup2(ready[1], 3) != 3
                || libc::syscall(libc::SYS_close_range, 4u32, u32::MAX, 0u32) != 0
            {
                libc::_exit(3);
            }
            // Raw system calls: glibc's setuid would signal threads the child does not have.
            if libc::syscall(libc::SYS_setgid, 65534) != 0
                || libc::syscall(libc::SYS_setuid, 65534) != 0
            {
                libc::_exit(1);
            }
            let fd = libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET, 0);
            if fd < 0
                || libc::bind(fd, (&a as *const libc::sockaddr_un).cast(), len) != 0
                || libc::listen(fd, 16) != 0
            {
                libc::_exit(2);
            }
            libc::write(3, b"1".as_ptr().cast(), 1);
            // Until the test kills it.
            loop {
                libc::pause();
            }
        }
    }
    // SAFETY: the descriptors the pipe made; each end is owned once. The write end is closed
    // here, so a child that exits before writing reads as end of file.
    let (ready_r, ready_w) = unsafe {
        (
            OwnedFd::from_raw_fd(ready[0]),
            OwnedFd::from_raw_fd(ready[1]),
        )
    };
    drop(ready_w);
    let mut b = 0u8;
    // SAFETY: reading one byte into a local.
    let n = unsafe {
        libc::read(
            std::os::fd::AsRawFd::as_raw_fd(&ready_r),
            (&mut b as *mut u8).cast(),
            1,
        )
    };
    assert_eq!(n, 1, "the squatting child failed to bind the name");
    Some(Squatter { pid })
}

impl Drop for Squatter {
    fn drop(&mut self) {
        // SAFETY: our own child, killed and reaped once.
        unsafe {
            libc::kill(self.pid, libc::SIGKILL);
            libc::waitpid(self.pid, std::ptr::null_mut(), 0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_that_announces_a_port_is_read_and_reaped() {
        let mut c =
            ReadyChild::spawn(Command::new("sh").args(["-c", "echo READY 4242; exec sleep 30"]));
        assert_eq!(c.port(), 4242);
        c.signal(libc::SIGKILL);
        assert!(!c.wait().success());
    }

    #[test]
    #[should_panic(expected = "not READY <port>")]
    fn a_child_that_says_something_else_is_a_clear_failure() {
        ReadyChild::spawn(Command::new("sh").args(["-c", "echo hello"]));
    }

    #[test]
    fn the_runtime_runs_a_future() {
        assert_eq!(rt().block_on(async { 7 }), 7);
    }
}
