//! What the member programs (`barewire-dsm-node`, `barewire-actor-node`,
//! `barewire-work-node`) share: the handshake over standard input and output that lets a test
//! start a mesh of processes on ports chosen by the kernel, and a command reader.
//!
//! A member listens on port 0 and prints `READY <port>`; the test collects every member's and
//! answers each with `ADDRS <addr> ...` (every member's address, by rank). After that,
//! standard input carries commands, one per line, until `EXIT` or its end.

#![allow(dead_code)] // each member program uses its own part of it

use std::io::{BufRead, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};

use barewire::{Error, Node, Result};

/// Prints one line and flushes it (the test reads it at once).
pub fn say(s: &str) {
    println!("{s}");
    let _ = std::io::stdout().flush();
}

/// The value after `key` in `args`.
pub fn arg(args: &[String], key: &str) -> Option<String> {
    args.iter()
        .position(|a| a == key)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

/// The single-core runtime every member runs on (it sleeps when idle: members share CPUs).
pub fn runtime() -> barewire::engine::Runtime {
    barewire::engine::Runtime::builder()
        .cores(1)
        .sleeping()
        .build()
        .expect("runtime")
}

/// Listens on `bind` (port 0 unless it names one), prints `READY <port>`, and reads every
/// member's address from the `ADDRS` line.
pub fn handshake(node: &Node, bind: &str) -> Result<Vec<SocketAddr>> {
    let addr = if bind.contains(':') {
        bind.to_string()
    } else {
        format!("{bind}:0")
    };
    let addr = addr
        .parse()
        .map_err(|e| Error::Invalid(format!("--bind {bind}: {e}")))?;
    let port = node.listen(addr)?;
    say(&format!("READY {port}"));
    let mut line = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut line)
        .map_err(|e| Error::Invalid(e.to_string()))?;
    line.split_whitespace()
        .skip(1)
        .map(|s| s.parse().map_err(|e| Error::Invalid(format!("{s}: {e}"))))
        .collect()
}

/// The commands that follow on standard input, read by a thread: each line (trimmed) comes
/// through the receiver; the flag is raised at `EXIT` or the end of input.
pub fn commands() -> (mpsc::Receiver<String>, Arc<AtomicBool>) {
    let exit = Arc::new(AtomicBool::new(false));
    let watch = exit.clone();
    let (tx, rx) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        let mut l = String::new();
        while std::io::stdin().lock().read_line(&mut l).unwrap_or(0) > 0 && l.trim() != "EXIT" {
            let _ = tx.send(l.trim().to_string());
            l.clear();
        }
        watch.store(true, Ordering::Release);
    });
    (rx, exit)
}

/// Whether the exit flag of [`commands`] is up.
pub fn exiting(flag: &AtomicBool) -> bool {
    flag.load(Ordering::Acquire)
}

/// Prints `DOWN <rank>` for every member `sys` declares down, from a task of this core (kept
/// alive by the handle).
pub fn print_downs(sys: &barewire::actor::ActorSystem) -> barewire::engine::JoinHandle<()> {
    let s = sys.clone();
    barewire::engine::spawn_local(async move {
        let mut seen = 0;
        loop {
            let r = s.next_down(&mut seen).await;
            say(&format!("DOWN {r}"));
        }
    })
}
