//! Shared pieces of barewire's benchmarks: the echo workload, written once per runtime
//! (barewire, tokio, monoio) so the three are measured doing exactly the same thing.

pub mod apt;
pub mod echo;
pub mod perf;
pub mod reps;

/// Pins the calling thread to `cpu` (if the machine has it).
pub fn pin(cpu: usize) {
    if let Some(ids) = core_affinity::get_core_ids() {
        if let Some(id) = ids.into_iter().find(|c| c.id == cpu) {
            core_affinity::set_for_current(id);
        }
    }
}

/// Pins the calling thread to `cpu` and builds a tokio current_thread runtime (I/O and timers
/// enabled) on it: the tokio side of every comparison.
pub fn tokio_on(cpu: usize) -> tokio::runtime::Runtime {
    pin(cpu);
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// Lets the calling thread run on every online CPU again (a runtime pinned on this thread
/// earlier narrows what threads spawned from it inherit).
pub fn unpin() {
    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
    // SAFETY: a zeroed cpu_set_t is empty; CPU_SET writes inside it; sched_setaffinity reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for c in 0..n.max(libc::sysconf(libc::_SC_NPROCESSORS_ONLN) as usize) {
            libc::CPU_SET(c, &mut set);
        }
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// Starts this program again with `args`, as a server that prints `READY <port>` first; returns
/// the port and the child. (The bench binaries run their far side this way.)
pub fn spawn_ready(args: &[&str]) -> (u16, std::process::Child) {
    use std::io::BufRead;
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(args)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("server process");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port = line
        .trim()
        .strip_prefix("READY ")
        .unwrap_or_else(|| panic!("the server said {line:?}, not READY <port>"))
        .parse()
        .unwrap();
    (port, child)
}

/// This process as rank 0 of a two-member mesh on loopback: its node (listening on a port the
/// kernel picks), and a copy of this program started as `--serve <far_cpu> <this address>`
/// (which prints `READY <port>` and becomes rank 1). Returns the node, both addresses by
/// rank, and the child. Call it on a core (the node belongs to it).
pub fn lead_pair(
    far_cpu: usize,
) -> (
    barewire::Node,
    [std::net::SocketAddr; 2],
    std::process::Child,
) {
    let node = barewire::Node::new().expect("a node");
    let port = node
        .listen("127.0.0.1:0".parse().unwrap())
        .expect("listening on loopback");
    let me: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let (peer_port, child) = spawn_ready(&["--serve", &far_cpu.to_string(), &me.to_string()]);
    let peer = format!("127.0.0.1:{peer_port}").parse().unwrap();
    (node, [me, peer], child)
}

/// The value after `key` in `args`, if any.
pub fn flag<'a>(args: &'a [String], key: &str) -> Option<&'a str> {
    let i = args.iter().position(|a| a == key)?;
    args.get(i + 1).map(String::as_str)
}

/// The hidden `--serve CPU LEAD` of the benchmarks whose rank 1 is a copy of themselves
/// (started by [`lead_pair`]): runs `serve(lead)` on a spinning runtime pinned to CPU.
pub fn serve_rank1<F: std::future::Future<Output = ()>>(
    args: &[String],
    serve: impl FnOnce(std::net::SocketAddr) -> F,
) {
    let cpu: usize = args[0].parse().expect("--serve CPU");
    let lead: std::net::SocketAddr = args[1].parse().expect("--serve LEAD");
    unpin(); // started from a thread pinned to the other CPU
    reps::spinning_runtime(cpu).block_on(serve(lead));
}

/// clap's value parser for `--cpu A,B`: two CPU numbers, or an error that says so.
pub fn cpu_pair_arg(v: &str) -> Result<[usize; 2], String> {
    cpu_pair(v).ok_or_else(|| format!("{v:?} is not two CPU numbers, as A,B"))
}

/// `A,B` as two CPU numbers.
pub fn cpu_pair(v: &str) -> Option<[usize; 2]> {
    let mut p = v.split(',').map(|x| x.parse::<usize>().ok());
    match (p.next()?, p.next()?, p.next()) {
        (Some(a), Some(b), None) => Some([a, b]),
        _ => None,
    }
}
