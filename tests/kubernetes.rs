//! examples/k8s/cluster-hello.yaml's pods, on one host: the environment of each pod of the
//! indexed Job is taken from the manifest (its container's env, the Job's name, completions
//! and the Service's subdomain), plus what Kubernetes adds (`HOSTNAME`,
//! `JOB_COMPLETION_INDEX`). Each "pod" gets its own address on loopback and its DNS name
//! through a hosts file in a network namespace (`ip netns exec` mounts
//! /etc/netns/NAME/hosts over /etc/hosts); the last pod's name resolves only once it starts,
//! as with a headless Service. The pods form the cluster and run the workflow. Needs root;
//! CI runs as root, so there it must pass.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

struct Ns(String);
impl Drop for Ns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
        let _ = std::fs::remove_dir_all(format!("/etc/netns/{}", self.0));
    }
}

#[test]
fn the_indexed_job_of_the_manifest_forms_a_cluster_and_runs_a_workflow() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("this test needs root (a network namespace with its own hosts file)");
        }
        eprintln!("SKIP: needs root (a network namespace with its own hosts file)");
        return;
    }
    let root = env!("CARGO_MANIFEST_DIR");
    let text = std::fs::read_to_string(format!("{root}/examples/k8s/cluster-hello.yaml")).unwrap();
    let docs: Vec<serde_yaml::Value> = serde_yaml::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .collect();
    let job = docs.iter().find(|d| d["kind"] == "Job").expect("a Job");
    let service = docs
        .iter()
        .find(|d| d["kind"] == "Service")
        .expect("a Service");
    let name = job["metadata"]["name"].as_str().unwrap();
    let spec = &job["spec"];
    assert_eq!(spec["completionMode"], "Indexed");
    let n = spec["completions"].as_u64().unwrap() as usize;
    let pod = &spec["template"]["spec"];
    let subdomain = pod["subdomain"].as_str().unwrap();
    assert_eq!(
        service["metadata"]["name"].as_str(),
        Some(subdomain),
        "pods' subdomain is the Service"
    );
    assert_eq!(service["spec"]["clusterIP"], "None", "a headless Service");
    let container = &pod["containers"][0];
    let env: Vec<(String, String)> = container["env"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap().into(),
                e["value"].as_str().unwrap().into(),
            )
        })
        .collect();

    let example = common::example("cluster_hello");
    let ns = Ns(format!("bwk8s{}", std::process::id() % 100_000));
    assert!(Command::new("ip")
        .args(["netns", "add", &ns.0])
        .status()
        .unwrap()
        .success());
    assert!(Command::new("ip")
        .args(["netns", "exec", &ns.0, "ip", "link", "set", "lo", "up"])
        .status()
        .unwrap()
        .success());
    let dir = format!("/etc/netns/{}", ns.0);
    std::fs::create_dir_all(&dir).unwrap();
    let hosts = format!("{dir}/hosts");
    let entry = |i: usize| format!("127.0.0.{} {name}-{i}.{subdomain}\n", 11 + i);
    let mut all = String::from("127.0.0.1 localhost\n");
    for i in 0..n - 1 {
        all += &entry(i);
    }
    std::fs::write(&hosts, all).unwrap();

    let start = |i: usize| {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &ns.0, "timeout", "120"])
            .arg(&example)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("HOSTNAME", format!("{name}-{i}"))
            .env("JOB_COMPLETION_INDEX", i.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in &env {
            c.env(k, v);
        }
        c.spawn().unwrap()
    };
    let mut pods: Vec<_> = (0..n - 1).map(start).collect();
    // The last pod is scheduled late: its name appears when it starts.
    std::thread::sleep(Duration::from_millis(800));
    std::fs::OpenOptions::new()
        .append(true)
        .open(&hosts)
        .unwrap()
        .write_all(entry(n - 1).as_bytes())
        .unwrap();
    pods.push(start(n - 1));
    let outs: Vec<_> = pods
        .into_iter()
        .map(|p| p.wait_with_output().unwrap())
        .collect();
    let report: String = outs
        .iter()
        .enumerate()
        .map(|(i, o)| {
            format!(
                "pod {i}: {} {}{}\n",
                o.status,
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            )
        })
        .collect();
    assert!(outs.iter().all(|o| o.status.success()), "{report}");
    let want = format!("{n} processes (Kubernetes): total 6, sum of squares 1..6 = 91");
    assert!(
        String::from_utf8_lossy(&outs[0].stdout).contains(&want),
        "{report}"
    );
}
