//! barewire-perf: perftest-compatible microbenchmarks over barewire, with the peers installed
//! here measured side by side (`compare`) and a results section regenerated in one command
//! (`report`).
//!
//! The pieces are a library so the command line, the table format and the peers' output
//! parsers are tested like any other code; `src/bin/barewire_perf.rs` is the thin binary.

pub mod cli;
pub mod compare;
pub mod floor;
pub mod host;
pub mod peers;
pub mod plot;
pub mod report;
pub mod run;
pub mod slices;
pub mod table;

use cli::Command;

/// Runs the command line `args` (without the program name); the process's exit code.
pub fn main_with(args: &[String]) -> i32 {
    match cli::parse(args) {
        Err(e) => {
            eprint!("{e}");
            if !e.ends_with('\n') {
                eprintln!();
            }
            2
        }
        Ok(Command::Help(text)) => {
            print!("{text}");
            0
        }
        Ok(Command::Run(r)) => match run::run(&r) {
            Err(e) => {
                eprintln!("barewire-perf: {e}");
                1
            }
            Ok(out) => {
                if let (Some(path), Some((_, h))) = (&r.plot, out.lat.first()) {
                    let title = format!("barewire {} {} B", r.test, r.sizes[0]);
                    let series = vec![("barewire".to_string(), plot::curve(h))];
                    if let Err(e) = plot::plot(path, &title, &series) {
                        eprintln!("barewire-perf: {e}");
                        return 1;
                    }
                }
                0
            }
        },
        Ok(Command::Compare(c)) => {
            let cmp = compare::compare(&c);
            print!("{}", report::table(&cmp));
            if let Some(path) = &c.plot {
                let mut series = Vec::new();
                if let Some(h) = &cmp.write_lat {
                    series.push(("barewire write_lat 8 B (RTT/2)".to_string(), plot::curve(h)));
                }
                let mut seen = Vec::new();
                for r in cmp
                    .rows
                    .iter()
                    .filter(|r| r.peer.unit == compare::Unit::Micros)
                {
                    if seen.contains(&r.peer.tool) {
                        continue;
                    }
                    seen.push(r.peer.tool.clone());
                    let pts = if r.peer.percentiles.is_empty() {
                        vec![(50.0, r.peer.value)]
                    } else {
                        r.peer.percentiles.clone()
                    };
                    series.push((format!("{} ({})", r.peer.tool, r.peer.what), pts));
                }
                if let Err(e) = plot::plot(path, "8 B latency on loopback", &series) {
                    eprintln!("barewire-perf: {e}");
                    return 1;
                }
            }
            if let Some(path) = &c.results {
                if let Err(e) = report::write_report(path, &c, &cmp) {
                    eprintln!("barewire-perf: {e}");
                    return 1;
                }
                println!("wrote {}", path.display());
            }
            0
        }
    }
}
