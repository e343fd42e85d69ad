//! Choosing a transport on this host, through the environment as users do.

use barewire_drivers::{verbs_devices, DriverConfig, Transport};

#[test]
fn verbs_without_a_device_is_a_clear_error_and_auto_falls_back_to_soft() {
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
        (auto.transport, auto.device.as_str()),
        (Transport::Soft, "soft")
    );
    let soft = DriverConfig::parse("soft", None).unwrap().select().unwrap();
    assert_eq!(soft.transport, Transport::Soft);
    assert!(DriverConfig::parse("token-ring", None).is_err());
}
