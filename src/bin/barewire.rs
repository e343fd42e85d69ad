//! barewire: the local launcher. Starts N copies of a program on this host with the same
//! environment shape `srun` gives (rank, size, local rank, node list, tasks per node), each
//! pinned to a CPU; a launcher, not a daemon: it waits for them and returns.
//!
//! ```text
//! barewire run -n N [--no-pin] [--base-port P] -- PROGRAM [ARGS...]
//! ```
//!
//! Each process gets `BAREWIRE_RANK`, `BAREWIRE_SIZE`, `BAREWIRE_LOCAL_RANK`,
//! `BAREWIRE_NODELIST=127.0.0.1`, `BAREWIRE_TASKS_PER_NODE=N` and `BAREWIRE_BASE_PORT` (the
//! first of N consecutive ports, free (TCP and UDP) when checked; `barewire::cluster::Launch::from_env` reads
//! them all). When one exits with a failure, the others are stopped (SIGTERM, then SIGKILL
//! after 2 s) and the launcher exits with that status; otherwise with 0.

use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// Says what is wrong with the command line, and how it goes.
fn usage(why: &str) -> ! {
    eprintln!("barewire: {why}");
    eprintln!("usage: barewire run -n N [--no-pin] [--base-port P] -- PROGRAM [ARGS...]");
    std::process::exit(2);
}

/// N consecutive ports that nothing uses now, TCP (the mesh) and UDP (membership). The search
/// starts at a place drawn from this process's id, so that launchers started side by side do
/// not pick the same ports.
fn free_ports(n: usize) -> u16 {
    let slots = (60_000u32 - 20_000) / 97;
    let first = std::process::id().wrapping_mul(2_654_435_761) % slots;
    'base: for i in 0..slots {
        let base = (20_000 + (first + i) % slots * 97) as u16;
        for k in 0..n as u16 {
            let at = ("127.0.0.1", base + k);
            if std::net::TcpListener::bind(at).is_err() || std::net::UdpSocket::bind(at).is_err() {
                continue 'base;
            }
        }
        return base;
    }
    eprintln!("barewire run: no {n} free consecutive ports");
    std::process::exit(1);
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) != Some("run") {
        usage("the one command is `run`");
    }
    let Some(dash) = args.iter().position(|a| a == "--") else {
        usage("no `--` before the program to run")
    };
    let (opts, program) = (&args[1..dash], &args[dash + 1..]);
    if program.is_empty() {
        usage("no program after `--`");
    }
    let mut n = 0usize;
    let mut pin = true;
    let mut base = None;
    let mut it = opts.iter();
    while let Some(o) = it.next() {
        match o.as_str() {
            "-n" => {
                n = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or_else(|| usage("-n takes a number of processes"))
            }
            "--no-pin" => pin = false,
            "--base-port" => {
                base = Some(
                    it.next()
                        .and_then(|v| v.parse().ok())
                        .unwrap_or_else(|| usage("--base-port takes a port number")),
                )
            }
            other => usage(&format!("unknown option {other:?}")),
        }
    }
    if n == 0 {
        usage("-n: at least one process");
    }
    let base: u16 = base.unwrap_or_else(|| free_ports(n));
    let cpus = std::thread::available_parallelism().map_or(1, |c| c.get());
    let mut children: Vec<Option<Child>> = Vec::with_capacity(n);
    for rank in 0..n {
        let mut cmd = Command::new(&program[0]);
        cmd.args(&program[1..])
            .env("BAREWIRE_RANK", rank.to_string())
            .env("BAREWIRE_SIZE", n.to_string())
            .env("BAREWIRE_LOCAL_RANK", rank.to_string())
            .env("BAREWIRE_NODELIST", "127.0.0.1")
            .env("BAREWIRE_TASKS_PER_NODE", n.to_string())
            .env("BAREWIRE_BASE_PORT", base.to_string());
        if pin {
            let cpu = rank % cpus;
            // SAFETY: runs in the child between fork and exec; sched_setaffinity on a cpu_set_t
            // we own is async-signal-safe and touches no lock.
            unsafe {
                cmd.pre_exec(move || {
                    let mut set: libc::cpu_set_t = std::mem::zeroed();
                    libc::CPU_SET(cpu, &mut set);
                    libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
                    Ok(())
                });
            }
        }
        match cmd.spawn() {
            Ok(c) => children.push(Some(c)),
            Err(e) => {
                eprintln!("barewire run: starting {}: {e}", program[0]);
                stop_all(&mut children);
                std::process::exit(1);
            }
        }
    }
    let mut status = 0;
    while status == 0 && children.iter().any(Option::is_some) {
        for slot in children.iter_mut() {
            let Some(c) = slot else { continue };
            if let Ok(Some(s)) = c.try_wait() {
                *slot = None;
                if !s.success() {
                    status = s.code().unwrap_or(128 + s.signal().unwrap_or(0));
                    eprintln!("barewire run: a process failed ({s}); stopping the others");
                    break;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    stop_all(&mut children);
    std::process::exit(status);
}

fn stop_all(children: &mut [Option<Child>]) {
    for c in children.iter().flatten() {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
    }
    let t0 = Instant::now();
    for slot in children.iter_mut() {
        if let Some(c) = slot {
            while t0.elapsed() < Duration::from_secs(2) {
                if let Ok(Some(_)) = c.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        *slot = None;
    }
}
