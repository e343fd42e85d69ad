//! The soak's checks catch what they are for: each deliberately broken worker or fault
//! (`--break`) fails the run with the violation that names it. `fake-cut` and `no-keepalive`
//! need network namespaces, so this test runs as root (as CI does). (The soak itself,
//! unbroken, runs for two minutes in `scripts/test.sh`.) One run at a time: each keeps three
//! processes busy.

use std::process::Command;

fn soak(what: &str, seconds: u32, fault_every_ms: u32, faults: &str) -> (bool, String) {
    // Link cuts need the network namespaces (root); the other checks do not.
    let net = if matches!(what, "fake-cut" | "no-keepalive") {
        "netns"
    } else {
        "auto"
    };
    let out = Command::new(env!("CARGO_BIN_EXE_barewire-soak"))
        .args(["--seconds", &seconds.to_string(), "--seed", "5"])
        .args(["--fault-every-ms", &fault_every_ms.to_string()])
        .args(["--faults", faults])
        .args(["--break", what, "--net", net])
        .output()
        .expect("barewire-soak runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn every_check_catches_its_broken_variant() {
    // Faults stop 8 s before the end. resume-zero needs a restart before that, so it gets
    // kills alone; the link-cut checks get nothing but cuts, since a kill or stop near a cut
    // excuses that cut from the check.
    let all = "kill,stop,cut";
    for (what, seconds, every, faults, expect) in [
        ("dup", 10, 2000, all, "VIOLATION expected message"),
        ("lost-write", 12, 2000, all, "was acknowledged"),
        ("leak", 20, 2000, all, "at half time"),
        ("resume-zero", 20, 800, "kill", "delivered went back"),
        ("fake-cut", 24, 1000, "cut", "during a"),
        // Long cuts (4 to 5.5 s) 1.5 to 4.5 s apart: the streams deliver again in between.
        (
            "no-keepalive",
            30,
            3000,
            "long-cut",
            "did not hear that its connection was gone",
        ),
        ("dsm-no-lock", 20, 60_000, all, "DSM update"),
        ("actor-double", 20, 60_000, all, "actor ask"),
    ] {
        let (ok, out) = soak(what, seconds, every, faults);
        assert!(!ok, "--break {what} passed:\n{out}");
        assert!(
            out.contains(expect),
            "--break {what}: no {expect:?} in\n{out}"
        );
    }
}
