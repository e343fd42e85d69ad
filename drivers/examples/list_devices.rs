//! Lists the RDMA devices rdma-core sees and the one barewire would use.
//!
//!     cargo run -p barewire-drivers --example list_devices
//!     BAREWIRE_DRIVER=verbs cargo run -p barewire-drivers --example list_devices

fn main() {
    let devs = barewire_drivers::verbs_devices();
    if devs.is_empty() {
        println!("rdma-core sees no RDMA device");
    }
    for d in &devs {
        println!("{:<12} {}", d.name, d.transport);
    }
    println!(
        "{:<12} soft (barewire's software provider, always available)",
        "soft"
    );
    let cfg = match barewire_drivers::DriverConfig::from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    };
    match cfg.select() {
        Ok(c) => println!(
            "would use: {} ({}), defaults {:?}",
            c.device, c.transport, c.defaults
        ),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}
