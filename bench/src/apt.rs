//! The Debian packages a benchmark's peer comes from (ScaLAPACK, redis, Erlang, UCX, libfabric,
//! qperf, sockperf, a font for the plots): a benchmark that needs one installs it on first
//! use, as `scripts/setup.sh` installs the project's own, with `apt-get` as root or through
//! passwordless `sudo`. Where that cannot be done (no `apt-get` on the PATH, no root, or
//! `BAREWIRE_NO_INSTALL` set), [`tool`] and [`ensure`] say which command would, and the caller
//! leaves that peer's rows out.
//!
//! ```no_run
//! // Before running redis beside barewire:
//! match barewire_bench::apt::tool("redis-server", "redis-server") {
//!     Ok(()) => { /* run it */ }
//!     Err(how) => eprintln!("redis rows skipped ({how})"),
//! }
//! ```

use std::process::{Command, Stdio};
use std::sync::Once;

/// Whether `tool` is an executable file in a directory of the PATH.
pub fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|p| {
        std::env::split_paths(&p).any(|d| {
            let f = d.join(tool);
            f.is_file()
                && std::fs::metadata(&f)
                    .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o111 != 0)
                    .unwrap_or(false)
        })
    })
}

/// Makes `tool` available, installing `package` if it is not on the PATH. `Err` says what to
/// install when this process cannot.
pub fn tool(tool: &str, package: &str) -> Result<(), String> {
    tool_if(tool, package, may_install())
}

/// Whether this process may install (`BAREWIRE_NO_INSTALL` unset).
fn may_install() -> bool {
    std::env::var_os("BAREWIRE_NO_INSTALL").is_none()
}

fn tool_if(tool: &str, package: &str, may: bool) -> Result<(), String> {
    if on_path(tool) {
        return Ok(());
    }
    ensure_if(&[package], may)?;
    if on_path(tool) {
        Ok(())
    } else {
        Err(format!("{tool} is not on the PATH (package {package})"))
    }
}

/// Installs those of `packages` that are not installed. `Err` names the `apt-get` command
/// when this process cannot run it, or says that it failed.
pub fn ensure(packages: &[&str]) -> Result<(), String> {
    ensure_if(packages, may_install())
}

fn ensure_if(packages: &[&str], may: bool) -> Result<(), String> {
    let missing: Vec<&str> = packages.iter().copied().filter(|p| !installed(p)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    let how = format!("apt-get install {}", missing.join(" "));
    if !may || !on_path("apt-get") {
        return Err(how);
    }
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let sudo = !root
        && on_path("sudo")
        && Command::new("sudo")
            .args(["-n", "true"])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
    if !root && !sudo {
        return Err(format!("{how} (as root)"));
    }
    let apt = |args: &[&str]| {
        let mut c = if root {
            Command::new("apt-get")
        } else {
            let mut c = Command::new("sudo");
            c.args(["-n", "apt-get"]);
            c
        };
        c.env("DEBIAN_FRONTEND", "noninteractive")
            .args(args)
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    eprintln!(
        "barewire-bench: installing {} (Debian packages)",
        missing.join(" ")
    );
    static UPDATED: Once = Once::new();
    UPDATED.call_once(|| {
        apt(&["update", "-qq"]);
    });
    let mut args = vec!["install", "-y", "-qq", "--no-install-recommends"];
    args.extend(&missing);
    if apt(&args) && missing.iter().all(|p| installed(p)) {
        Ok(())
    } else {
        Err(format!("{how} failed"))
    }
}

/// Whether dpkg has `package` installed.
fn installed(package: &str) -> bool {
    on_path("dpkg-query")
        && Command::new("dpkg-query")
            .args(["-W", "-f=${Status}", package])
            .stderr(Stdio::null())
            .output()
            .is_ok_and(|o| o.stdout.ends_with(b" installed"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tool_on_the_path_needs_nothing_and_a_refusal_names_the_command() {
        assert!(on_path("sh"));
        assert!(!on_path("barewire-no-such-tool"));
        assert_eq!(tool("sh", "dash"), Ok(()));
        // Told not to install: the answer is the command to run.
        let e = tool_if("barewire-no-such-tool", "barewire-no-such-package", false).unwrap_err();
        assert_eq!(e, "apt-get install barewire-no-such-package");
    }
}
