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

/// clap's value parser for `--cpu A,B`: two CPU numbers this machine has, or an error that
/// says which is not.
pub fn cpu_pair_arg(v: &str) -> Result<[usize; 2], String> {
    let pair = cpu_pair(v).ok_or_else(|| format!("{v:?} is not two CPU numbers, as A,B"))?;
    for cpu in pair {
        usable(cpu)?;
    }
    Ok(pair)
}

/// clap's value parser for a single `--cpu N`: a CPU this machine has.
pub fn cpu_arg(v: &str) -> Result<usize, String> {
    let cpu = v
        .parse::<usize>()
        .map_err(|_| format!("{v:?} is not a CPU number"))?;
    usable(cpu)
}

/// `cpu` if this machine has it. (Not this process's affinity mask: a bench's far side is
/// started from a thread pinned to the near side's CPU, and parses the same arguments.)
fn usable(cpu: usize) -> Result<usize, String> {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) };
    let n = if n > 0 { n as usize } else { 1 };
    if cpu < n.min(libc::CPU_SETSIZE as usize) {
        Ok(cpu)
    } else {
        Err(format!("CPU {cpu} does not exist here (CPUs 0-{})", n - 1))
    }
}

/// `A,B` as two CPU numbers.
pub fn cpu_pair(v: &str) -> Option<[usize; 2]> {
    let mut p = v.split(',').map(|x| x.parse::<usize>().ok());
    match (p.next()?, p.next()?, p.next()) {
        (Some(a), Some(b), None) => Some([a, b]),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cpu_the_machine_does_not_have_is_refused_with_its_number() {
        let first = core_affinity::get_core_ids().expect("an affinity mask")[0].id;
        assert_eq!(cpu_arg(&first.to_string()), Ok(first));
        assert_eq!(
            cpu_pair_arg(&format!("{first},{first}")),
            Ok([first, first])
        );
        // libc's CPU sets end at 1024: core_affinity would abort on such a number.
        let e = cpu_pair_arg(&format!("{first},5000"));
        assert!(e.as_ref().is_err_and(|m| m.contains("CPU 5000")), "{e:?}");
        let e = cpu_arg("5000");
        assert!(e.as_ref().is_err_and(|m| m.contains("CPU 5000")), "{e:?}");
        assert!(cpu_arg("x").is_err() && cpu_pair_arg("1").is_err());
    }
}
