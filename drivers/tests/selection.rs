//! Choosing a transport on this host, through the environment as users do.

use barewire_drivers::{verbs_devices, DriverConfig, Transport};

#[test]
fn verbs_without_a_device_is_a_clear_error_and_auto_falls_back_to_soft_and_shm() {
    if !verbs_devices().is_empty() {
        eprintln!("SKIP: this host has RDMA devices; the no-device behaviour cannot be observed");
        return;
    }
    let e = DriverConfig::parse("verbs", None)
        .unwrap()
        .select()
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("no verbs RDMA device found")
            && e.contains("BAREWIRE_DRIVER=soft")
            && e.contains("rdma link add"),
        "{e}"
    );
    let e = DriverConfig::parse("roce2", None)
        .unwrap()
        .select()
        .unwrap_err()
        .to_string();
    assert!(e.contains("roce2"), "{e}");
    let auto = DriverConfig::parse("", None).unwrap().select().unwrap();
    assert_eq!(
        (auto.transport, auto.device.as_str(), auto.same_host_shm),
        (Transport::Soft, "soft", true),
        "auto: shm on this host, the software provider for the others"
    );
    // Asked for explicitly, a transport is that transport alone: never shm behind its back.
    let soft = DriverConfig::parse("soft", None).unwrap().select().unwrap();
    assert_eq!(
        (soft.transport, soft.same_host_shm),
        (Transport::Soft, false)
    );
    let shm = DriverConfig::parse("shm", None).unwrap().select().unwrap();
    assert_eq!((shm.transport, shm.same_host_shm), (Transport::Shm, false));
    assert!(DriverConfig::parse("token-ring", None).is_err());
}
