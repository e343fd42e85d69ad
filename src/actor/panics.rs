//! Panic reports that do not hold up the core: a panic inside an actor is an ordinary exit
//! reason, but the standard hook, with `RUST_BACKTRACE` set, resolves the backtrace's symbols
//! on the panicking thread (hundreds of milliseconds for a large binary), while every task of
//! that core, heartbeats included, waits.

use std::backtrace::Backtrace;
use std::sync::mpsc;
use std::sync::Once;

/// One panic of an actor, as the reporter thread writes it.
struct Report {
    thread: String,
    location: String,
    message: String,
    backtrace: Backtrace,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "actor on thread '{}' panicked at {}:\n{}",
            self.thread, self.location, self.message
        )?;
        match self.backtrace.status() {
            std::backtrace::BacktraceStatus::Captured => {
                write!(f, "\nstack backtrace:\n{}", self.backtrace)
            }
            _ => Ok(()),
        }
    }
}

/// Makes panics inside actors (their handlers, `started` and `stopped`, and cluster tasks) report
/// from a thread of their own, as Erlang's logger writes crash reports: the panicking core
/// only captures the backtrace (unresolved, when `RUST_BACKTRACE` asks for one) and goes on;
/// the reporter resolves it and hands the report to `write`. Every other panic goes to the
/// hook that was installed before. Call it once, early; later calls do nothing.
///
/// Without it, a panicking actor's core is held while the standard hook resolves the
/// backtrace, and a node whose core stops for longer than its peers' node-down deadline
/// (`SystemOptions`: 50 ms by default) is taken for dead.
///
/// ```
/// barewire::actor::report_panics_with(|report| eprintln!("{report}"));
/// ```
pub fn report_panics_with(write: impl Fn(String) + Send + 'static) {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let (tx, rx) = mpsc::channel::<Report>();
        let spawned = std::thread::Builder::new()
            .name("barewire-panics".into())
            .spawn(move || {
                for report in rx {
                    write(report.to_string());
                }
            });
        if spawned.is_err() {
            // No reporter thread: keep the standard hook.
            return;
        }
        let before = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !super::cell::in_handler() {
                return before(info);
            }
            let message = super::cell::panic_message(info.payload());
            let report = Report {
                thread: std::thread::current()
                    .name()
                    .unwrap_or("<unnamed>")
                    .to_string(),
                location: info.location().map(|l| l.to_string()).unwrap_or_default(),
                message,
                backtrace: Backtrace::capture(),
            };
            if let Err(mpsc::SendError(report)) = tx.send(report) {
                // The reporter is gone: write it here after all.
                eprintln!("{report}");
            }
        }));
    });
}

/// [`report_panics_with`] writing each report to standard error.
///
/// ```
/// barewire::actor::report_panics();
/// ```
pub fn report_panics() {
    report_panics_with(|report| eprintln!("{report}"));
}
