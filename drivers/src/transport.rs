//! Transports, their defaults, and choosing one.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::verbs::{verbs_devices, DeviceInfo};

/// Which RDMA transport to use.
///
/// ```
/// use barewire_drivers::Transport;
/// let t: Transport = "roce2".parse().unwrap(); // as BAREWIRE_DRIVER spells them
/// assert_eq!(t, Transport::RoCEv2);
/// assert!("carrier-pigeon".parse::<Transport>().is_err());
/// assert!(Transport::InfiniBand.defaults().mtu > Transport::RoCEv2.defaults().mtu);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// InfiniBand.
    InfiniBand,
    /// RoCE v1 (Ethernet link layer, GRH over Ethernet).
    RoCEv1,
    /// RoCE v2 (over UDP/IP).
    RoCEv2,
    /// A hardware iWARP NIC, or Linux siw.
    IWarp,
    /// barewire's software provider (iWARP over TCP through the engine).
    Soft,
    /// Shared memory with a peer process on the same host (see the `shm` module docs).
    Shm,
    /// The first usable verbs device, otherwise `Soft`.
    Auto,
}

impl Transport {
    /// The defaults that suit this transport.
    pub fn defaults(self) -> TransportDefaults {
        match self {
            Transport::InfiniBand => TransportDefaults {
                mtu: 4096,
                queue_depth: 256,
                max_message: 1 << 30,
                traffic_class: 0,
                gid_index: 0,
                crc: true,
                keepalive: DEFAULT_KEEPALIVE,
            },
            // RoCE: a 1024 B path MTU fits a standard 1500 B Ethernet frame with headroom.
            Transport::RoCEv1 => TransportDefaults {
                mtu: 1024,
                queue_depth: 256,
                max_message: 1 << 30,
                traffic_class: 0,
                gid_index: 0,
                crc: true,
                keepalive: DEFAULT_KEEPALIVE,
            },
            // RoCE v2: DSCP 26 (AF31, traffic class 106) is the usual lossless RDMA class; the
            // GID index of the IPv4-mapped RoCE v2 GID is commonly 3 (rdma-core's show_gids).
            Transport::RoCEv2 => TransportDefaults {
                mtu: 1024,
                queue_depth: 256,
                max_message: 1 << 30,
                traffic_class: 106,
                gid_index: 3,
                crc: true,
                keepalive: DEFAULT_KEEPALIVE,
            },
            Transport::IWarp => TransportDefaults {
                mtu: 1500,
                queue_depth: 256,
                max_message: 1 << 30,
                traffic_class: 0,
                gid_index: 0,
                crc: true,
                keepalive: DEFAULT_KEEPALIVE,
            },
            Transport::Soft | Transport::Shm | Transport::Auto => TransportDefaults {
                mtu: 16 * 1024,
                queue_depth: 256,
                max_message: 1 << 30,
                traffic_class: 0,
                gid_index: 0,
                crc: true,
                keepalive: DEFAULT_KEEPALIVE,
            },
        }
    }
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Transport::InfiniBand => "infiniband",
            Transport::RoCEv1 => "roce",
            Transport::RoCEv2 => "roce2",
            Transport::IWarp => "iwarp",
            Transport::Soft => "soft",
            Transport::Shm => "shm",
            Transport::Auto => "auto",
        })
    }
}

impl FromStr for Transport {
    type Err = DriverError;
    fn from_str(s: &str) -> Result<Self, DriverError> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "auto" | "" => Transport::Auto,
            "soft" => Transport::Soft,
            "shm" => Transport::Shm,
            "ib" | "infiniband" => Transport::InfiniBand,
            "roce" | "rocev1" => Transport::RoCEv1,
            "roce2" | "rocev2" => Transport::RoCEv2,
            "iwarp" => Transport::IWarp,
            other => return Err(DriverError::UnknownTransport(other.to_string())),
        })
    }
}

/// Per-transport settings; every field can be overridden.
///
/// ```
/// use barewire_drivers::Transport;
/// let soft = Transport::Soft.defaults();
/// assert!(soft.crc); // MPA CRC32c asked for, as RFC 5044 intends
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransportDefaults {
    /// Path MTU (verbs) or MULPDU (soft), in bytes.
    pub mtu: u32,
    /// Send and receive queue depth.
    pub queue_depth: u32,
    /// Largest message.
    pub max_message: u64,
    /// IP traffic class (RoCE v2: DSCP << 2).
    pub traffic_class: u8,
    /// GID table index.
    pub gid_index: u8,
    /// Ask for MPA CRC32c on iWARP connections (the software provider's): on everywhere by
    /// default, as RFC 5044 intends. Switch it off only for trusted links (the same host, or a
    /// link already protected), on both sides: MPA uses CRC when either side asks.
    pub crc: bool,
    /// How long a software-provider connection may go without a sign of the peer's host
    /// before it fails, idle or not (`None`: without limit). The kernel probes an idle
    /// connection (TCP keepalive) and the peer's kernel answers, so a peer that is stopped or
    /// busy keeps its connection, while a cut link or a host that is gone fails it: then what
    /// waits on that connection (a posted receive, a channel's `recv`) ends with an error
    /// instead of waiting for ever. At least 1 s. Verbs queue pairs have no such watch (their
    /// NIC retries only what is outstanding), and shm needs none (its peers share this host:
    /// one that dies is seen at once).
    pub keepalive: Option<Duration>,
}

/// [`TransportDefaults::keepalive`]'s default: the software provider's own, 10 s.
pub const DEFAULT_KEEPALIVE: Option<Duration> =
    Some(barewire_soft_rdma::provider::DEFAULT_KEEPALIVE);

/// What the application asked for, from code or from the environment.
///
/// ```
/// use barewire_drivers::{DriverConfig, Transport};
/// // The software provider, CRC off (a trusted link), deeper queues.
/// let cfg = DriverConfig::parse("soft", None).unwrap().crc(false).queue_depth(1024);
/// let chosen = cfg.select().unwrap();
/// assert_eq!((chosen.transport, chosen.device.as_str()), (Transport::Soft, "soft"));
/// // An explicit hardware transport with no such device is an error, not a fallback.
/// # if barewire_drivers::verbs_devices().is_empty() {
/// assert!(DriverConfig::parse("ib", None).unwrap().select().is_err());
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverConfig {
    /// The transport (`BAREWIRE_DRIVER`: soft, shm, verbs, ib, roce, roce2, iwarp, auto).
    pub transport: Transport,
    /// Only a hardware (verbs) device will do: `BAREWIRE_DRIVER=verbs`, which takes the first
    /// verbs device of any transport and never falls back to the software provider.
    pub verbs_only: bool,
    /// A device name (`BAREWIRE_DEVICE`, e.g. `mlx5_0` or `siw0`).
    pub device: Option<String>,
    /// Settings that replace the chosen transport's defaults.
    pub overrides: Overrides,
}

/// Replacements for a transport's defaults, from the builder methods of [`DriverConfig`] or
/// from the environment: `BAREWIRE_MTU`, `BAREWIRE_QUEUE_DEPTH`, `BAREWIRE_MAX_MESSAGE`,
/// `BAREWIRE_TRAFFIC_CLASS`, `BAREWIRE_GID_INDEX`, `BAREWIRE_CRC` (on/off),
/// `BAREWIRE_KEEPALIVE` (seconds, or off).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Overrides {
    /// See [`TransportDefaults::mtu`].
    pub mtu: Option<u32>,
    /// See [`TransportDefaults::queue_depth`].
    pub queue_depth: Option<u32>,
    /// See [`TransportDefaults::max_message`].
    pub max_message: Option<u64>,
    /// See [`TransportDefaults::traffic_class`].
    pub traffic_class: Option<u8>,
    /// See [`TransportDefaults::gid_index`].
    pub gid_index: Option<u8>,
    /// See [`TransportDefaults::crc`].
    pub crc: Option<bool>,
    /// See [`TransportDefaults::keepalive`] (`Some(None)`: off).
    pub keepalive: Option<Option<Duration>>,
}

/// An on/off setting as the environment spells it: on, off, 1, 0, true, false, yes, no.
struct Switch(bool);

impl FromStr for Switch {
    type Err = &'static str;
    fn from_str(s: &str) -> Result<Switch, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "on" | "1" | "true" | "yes" => Ok(Switch(true)),
            "off" | "0" | "false" | "no" => Ok(Switch(false)),
            _ => Err("use on or off"),
        }
    }
}

/// A keepalive as the environment spells it: seconds (`10`, `2.5`, `10s`), or off (`off`,
/// `0`, `no`, `none`).
struct KeepaliveSetting(Option<Duration>);

impl FromStr for KeepaliveSetting {
    type Err = String;
    fn from_str(s: &str) -> Result<KeepaliveSetting, String> {
        let s = s.to_ascii_lowercase();
        if matches!(s.as_str(), "off" | "0" | "no" | "none" | "false") {
            return Ok(KeepaliveSetting(None));
        }
        let not_seconds = || "use a number of seconds (at least 1), or off".to_string();
        let secs: f64 = s
            .strip_suffix('s')
            .unwrap_or(&s)
            .trim()
            .parse()
            .map_err(|_| not_seconds())?;
        let d = Duration::try_from_secs_f64(secs).map_err(|_| not_seconds())?;
        barewire_engine::net::check_keepalive(d).map_err(|e| e.to_string())?;
        Ok(KeepaliveSetting(Some(d)))
    }
}

impl Overrides {
    fn apply(&self, d: &mut TransportDefaults) {
        d.mtu = self.mtu.unwrap_or(d.mtu);
        d.queue_depth = self.queue_depth.unwrap_or(d.queue_depth);
        d.max_message = self.max_message.unwrap_or(d.max_message);
        d.traffic_class = self.traffic_class.unwrap_or(d.traffic_class);
        d.gid_index = self.gid_index.unwrap_or(d.gid_index);
        d.crc = self.crc.unwrap_or(d.crc);
        d.keepalive = self.keepalive.unwrap_or(d.keepalive);
    }

    fn from_env() -> Result<Overrides, DriverError> {
        fn var<T: FromStr>(name: &str) -> Result<Option<T>, DriverError>
        where
            T::Err: fmt::Display,
        {
            match std::env::var(name) {
                Ok(v) if !v.is_empty() => {
                    v.trim()
                        .parse()
                        .map(Some)
                        .map_err(|e: T::Err| DriverError::BadSetting {
                            name: name.into(),
                            value: v,
                            why: e.to_string(),
                        })
                }
                _ => Ok(None),
            }
        }
        Ok(Overrides {
            mtu: var("BAREWIRE_MTU")?,
            queue_depth: var("BAREWIRE_QUEUE_DEPTH")?,
            max_message: var("BAREWIRE_MAX_MESSAGE")?,
            traffic_class: var("BAREWIRE_TRAFFIC_CLASS")?,
            gid_index: var("BAREWIRE_GID_INDEX")?,
            crc: var::<Switch>("BAREWIRE_CRC")?.map(|s| s.0),
            keepalive: var::<KeepaliveSetting>("BAREWIRE_KEEPALIVE")?.map(|k| k.0),
        })
    }
}

impl DriverConfig {
    /// Reads `BAREWIRE_DRIVER` and `BAREWIRE_DEVICE` (Auto and any device when unset).
    pub fn from_env() -> Result<DriverConfig, DriverError> {
        let driver = std::env::var("BAREWIRE_DRIVER").unwrap_or_default();
        let device = std::env::var("BAREWIRE_DEVICE")
            .ok()
            .filter(|d| !d.is_empty());
        let mut cfg = DriverConfig::parse(&driver, device)?;
        cfg.overrides = Overrides::from_env()?;
        Ok(cfg)
    }

    /// Path MTU (verbs) or MULPDU (soft) instead of the transport's default.
    pub fn mtu(mut self, v: u32) -> Self {
        self.overrides.mtu = Some(v);
        self
    }

    /// Queue depth instead of the transport's default.
    pub fn queue_depth(mut self, v: u32) -> Self {
        self.overrides.queue_depth = Some(v);
        self
    }

    /// Largest message instead of the transport's default.
    pub fn max_message(mut self, v: u64) -> Self {
        self.overrides.max_message = Some(v);
        self
    }

    /// IP traffic class (RoCE v2: DSCP << 2) instead of the transport's default.
    pub fn traffic_class(mut self, v: u8) -> Self {
        self.overrides.traffic_class = Some(v);
        self
    }

    /// GID index instead of the transport's default.
    pub fn gid_index(mut self, v: u8) -> Self {
        self.overrides.gid_index = Some(v);
        self
    }

    /// Asks for MPA CRC32c (`true`, the default) or not, for trusted links (see
    /// [`TransportDefaults::crc`]).
    ///
    /// ```
    /// let cfg = barewire_drivers::DriverConfig::parse("soft", None).unwrap().crc(false);
    /// assert!(!cfg.select().unwrap().defaults.crc);
    /// ```
    pub fn crc(mut self, on: bool) -> Self {
        self.overrides.crc = Some(on);
        self
    }

    /// How long a software-provider connection may go without a sign of the peer's host
    /// (`None`: without limit) instead of the default 10 s; see
    /// [`TransportDefaults::keepalive`]. [`select`](Self::select) refuses one under 1 s.
    ///
    /// ```
    /// use std::time::Duration;
    /// let cfg = barewire_drivers::DriverConfig::parse("soft", None).unwrap();
    /// let two = cfg.clone().keepalive(Some(Duration::from_secs(2)));
    /// assert_eq!(two.select().unwrap().defaults.keepalive, Some(Duration::from_secs(2)));
    /// assert!(cfg.keepalive(Some(Duration::from_millis(100))).select().is_err());
    /// ```
    pub fn keepalive(mut self, within: Option<Duration>) -> Self {
        self.overrides.keepalive = Some(within);
        self
    }

    /// As `from_env`, from the two values.
    pub fn parse(driver: &str, device: Option<String>) -> Result<DriverConfig, DriverError> {
        let verbs_only = driver.eq_ignore_ascii_case("verbs");
        let transport = if verbs_only {
            Transport::Auto
        } else {
            driver.parse()?
        };
        Ok(DriverConfig {
            transport,
            verbs_only,
            device,
            overrides: Overrides::default(),
        })
    }

    /// Chooses the transport and device this configuration asks for (see [`select`]).
    pub fn select(&self) -> Result<Chosen, DriverError> {
        let devs = devices_for(self.transport);
        if self.verbs_only && devs.is_empty() {
            return Err(DriverError::NoDevice {
                transport: "verbs".into(),
                found: describe(&devs),
            });
        }
        let mut chosen = select_from(self.transport, self.device.as_deref(), &devs)?;
        self.overrides.apply(&mut chosen.defaults);
        if let Some(k) = chosen.defaults.keepalive {
            barewire_engine::net::check_keepalive(k).map_err(|e| DriverError::BadSetting {
                name: "keepalive".into(),
                value: format!("{k:?}"),
                why: e.to_string(),
            })?;
        }
        Ok(chosen)
    }
}

/// Why no transport could be chosen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DriverError {
    /// A transport name nobody knows.
    #[error("unknown transport {0:?}: use soft, shm, verbs, ib, roce, roce2, iwarp or auto")]
    UnknownTransport(String),
    /// The requested transport has no device here.
    #[error(
        "no {transport} RDMA device found (rdma-core sees {found}); install rdma-core and the NIC's driver, \
         or for testing load a software device (rdma link add siw0 type siw netdev <if>), \
         or set BAREWIRE_DRIVER=soft to use barewire's software provider"
    )]
    NoDevice {
        /// What was asked for.
        transport: String,
        /// What rdma-core does see, for the message.
        found: String,
    },
    /// A setting that is not valid: a `BAREWIRE_*` variable that does not parse, or a value
    /// given to a [`DriverConfig`] builder method that no connection could use.
    #[error("{name}={value:?} is not a valid value: {why}")]
    BadSetting {
        /// The variable (or the builder method).
        name: String,
        /// Its value.
        value: String,
        /// What is wrong with it.
        why: String,
    },
    /// An rdma-core or librdmacm call failed.
    #[error("{call} failed: {error}")]
    Verbs {
        /// The call.
        call: String,
        /// What the OS said.
        error: String,
    },
    /// The peer rejected the connection.
    #[error("connection rejected by the peer ({} bytes of private data)", private_data.len())]
    Rejected {
        /// The peer's private data (often the reason).
        private_data: Vec<u8>,
    },
    /// Connection setup failed.
    #[error("connection failed: {0}")]
    Connect(String),
    /// A listener could not be set up ([`Listener::bind`](crate::Listener::bind)): the
    /// address is taken or not this host's, or the settings cannot be offered.
    #[error("cannot listen on {addr}: {why}")]
    Listen {
        /// The address asked for.
        addr: std::net::SocketAddr,
        /// What failed.
        why: String,
    },
    /// A work request could not be posted.
    #[error("post failed: {0}")]
    Post(String),
    /// A work request completed with an error status.
    #[error("work request {wr_id} completed with {status:?}")]
    Completion {
        /// The status.
        status: barewire_rdma_types::WcStatus,
        /// The work request.
        wr_id: u64,
    },
    /// Something this backend cannot do.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// Memory this machine cannot give: a buffer larger than its memory and swap, or one the
    /// kernel or the allocator refused.
    #[error("out of memory: {0}")]
    OutOfMemory(String),
    /// `BAREWIRE_DEVICE` names a device that does not exist.
    #[error("no RDMA device named {name:?} (rdma-core sees {found}); check BAREWIRE_DEVICE")]
    NoSuchDevice {
        /// The name asked for.
        name: String,
        /// What rdma-core does see.
        found: String,
    },
}

/// The transport and device that will be used.
///
/// ```
/// use barewire_drivers::{select, Transport};
/// let c = select(Transport::Auto, None).unwrap();
/// println!("auto chose {:?} ({})", c.transport, c.device);
/// println!("same-host peers through shm: {}", c.same_host_shm);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chosen {
    /// The transport.
    pub transport: Transport,
    /// The device name (`soft` for the software provider).
    pub device: String,
    /// Its defaults.
    pub defaults: TransportDefaults,
    /// Peers on this host and network namespace go through shared memory (`shm`), the others
    /// through `transport`: what `auto` chooses when there is no RDMA device.
    pub same_host_shm: bool,
}

fn describe(devs: &[DeviceInfo]) -> String {
    if devs.is_empty() {
        return "no devices".into();
    }
    devs.iter()
        .map(|d| format!("{} ({})", d.name, d.transport))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Chooses the transport and device: `Auto` takes the first usable verbs device (or the named
/// one) and otherwise the software provider with shared memory for peers on this host
/// ([`Chosen::same_host_shm`]), and says which on stderr; an explicit hardware
/// transport with no matching device is an error, never a silent fallback.
pub fn select(transport: Transport, device: Option<&str>) -> Result<Chosen, DriverError> {
    select_from(transport, device, &devices_for(transport))
}

/// The verbs devices, listed only where the choice can fall on one: an explicit soft or shm
/// request never loads libibverbs' device list (and so runs where no RDMA stack, or only an
/// interpreter such as Miri, is present).
fn devices_for(transport: Transport) -> Vec<DeviceInfo> {
    match transport {
        Transport::Soft | Transport::Shm => Vec::new(),
        _ => verbs_devices(),
    }
}

pub(crate) fn select_from(
    transport: Transport,
    device: Option<&str>,
    devs: &[DeviceInfo],
) -> Result<Chosen, DriverError> {
    let soft = || Chosen {
        transport: Transport::Soft,
        device: "soft".into(),
        defaults: Transport::Soft.defaults(),
        same_host_shm: false,
    };
    if transport == Transport::Soft {
        return Ok(soft());
    }
    if transport == Transport::Shm {
        return Ok(Chosen {
            transport: Transport::Shm,
            device: "shm".into(),
            defaults: Transport::Shm.defaults(),
            same_host_shm: false,
        });
    }
    let named = |d: &&DeviceInfo| device.is_none_or(|n| d.name == n);
    if let Some(name) = device {
        if !devs.iter().any(|d| d.name == name) && name != "soft" {
            return Err(DriverError::NoSuchDevice {
                name: name.into(),
                found: describe(devs),
            });
        }
        if name == "soft" {
            return Ok(soft());
        }
    }
    let pick = devs
        .iter()
        .filter(named)
        .find(|d| transport == Transport::Auto || d.transport == transport);
    match (pick, transport) {
        (Some(d), _) => {
            if transport == Transport::Auto {
                say_once(&format!(
                    "barewire: using RDMA device {} ({})",
                    d.name, d.transport
                ));
            }
            Ok(Chosen {
                transport: d.transport,
                device: d.name.clone(),
                defaults: d.transport.defaults(),
                same_host_shm: false,
            })
        }
        (None, Transport::Auto) => {
            say_once(
                "barewire: no usable RDMA device; peers on this host through shared memory, \
                 others through the software provider (iWARP over TCP)",
            );
            Ok(Chosen {
                same_host_shm: true,
                ..soft()
            })
        }
        (None, t) => Err(DriverError::NoDevice {
            transport: t.to_string(),
            found: describe(devs),
        }),
    }
}

/// Prints what `auto` chose, once per process (every core's node makes the same choice).
fn say_once(line: &str) {
    static SAID: std::sync::Once = std::sync::Once::new();
    // One write with its newline: ranks of one job share a stderr, and `eprintln!` may write
    // the line and its newline separately, so two ranks' notices ran together on one line.
    SAID.call_once(|| {
        use std::io::Write;
        let _ = std::io::stderr().write_all(format!("{line}\n").as_bytes());
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(name: &str, t: Transport) -> DeviceInfo {
        DeviceInfo {
            name: name.into(),
            transport: t,
        }
    }

    #[test]
    fn a_keepalive_is_spelled_in_seconds_or_off() {
        let k = |s: &str| s.parse::<KeepaliveSetting>().map(|k| k.0);
        assert_eq!(k("10"), Ok(Some(Duration::from_secs(10))));
        assert_eq!(k("2.5s"), Ok(Some(Duration::from_millis(2500))));
        for off in ["off", "0", "none", "No"] {
            assert_eq!(k(off), Ok(None), "{off}");
        }
        for bad in ["0.5", "soon", "-3", "1e12"] {
            let e = k(bad).expect_err(bad);
            assert!(e.contains("second") || e.contains("24 days"), "{bad}: {e}");
        }
    }

    #[test]
    fn auto_prefers_a_verbs_device_and_falls_back_to_soft() {
        let devs = [
            dev("siw0", Transport::IWarp),
            dev("mlx5_0", Transport::RoCEv2),
        ];
        assert_eq!(
            select_from(Transport::Auto, None, &devs).unwrap().device,
            "siw0"
        );
        assert_eq!(
            select_from(Transport::Auto, Some("mlx5_0"), &devs)
                .unwrap()
                .transport,
            Transport::RoCEv2
        );
        assert_eq!(
            select_from(Transport::Auto, None, &[]).unwrap().transport,
            Transport::Soft
        );
    }

    #[test]
    fn an_absent_transport_is_an_error_that_says_what_to_do() {
        let devs = [dev("siw0", Transport::IWarp)];
        let e = select_from(Transport::InfiniBand, None, &devs).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("infiniband")
                && msg.contains("siw0 (iwarp)")
                && msg.contains("BAREWIRE_DRIVER=soft"),
            "{msg}"
        );
        let e = select_from(Transport::Auto, Some("mlx5_9"), &devs).unwrap_err();
        assert!(matches!(e, DriverError::NoSuchDevice { .. }), "{e}");
        assert_eq!(
            select_from(Transport::IWarp, None, &devs).unwrap().device,
            "siw0"
        );
    }

    #[test]
    fn overrides_replace_the_defaults() {
        let cfg = DriverConfig::parse("soft", None)
            .unwrap()
            .mtu(4096)
            .queue_depth(64)
            .traffic_class(104)
            .gid_index(1)
            .max_message(1 << 20);
        let d = cfg.select().unwrap().defaults;
        assert_eq!(
            (
                d.mtu,
                d.queue_depth,
                d.traffic_class,
                d.gid_index,
                d.max_message
            ),
            (4096, 64, 104, 1, 1 << 20)
        );
        let plain = DriverConfig::parse("soft", None).unwrap().select().unwrap();
        assert_eq!(plain.defaults, Transport::Soft.defaults());
    }

    #[test]
    fn names_parse_and_defaults_differ_per_transport() {
        assert_eq!("ib".parse::<Transport>().unwrap(), Transport::InfiniBand);
        let verbs = DriverConfig::parse("verbs", None).unwrap();
        assert!(verbs.verbs_only && verbs.transport == Transport::Auto);
        assert_eq!("ROCE2".parse::<Transport>().unwrap(), Transport::RoCEv2);
        assert!("carrier-pigeon".parse::<Transport>().is_err());
        assert_eq!(Transport::RoCEv2.defaults().traffic_class, 106);
        assert_ne!(
            Transport::InfiniBand.defaults().mtu,
            Transport::RoCEv2.defaults().mtu
        );
    }
}
