//! barewire-peer: a passive RDMA peer over barewire's drivers, for the conformance suite and
//! for interoperability runs (soft against verbs, e.g. Linux siw).
//!
//! ```text
//! barewire-peer serve [PORT]     listen (0 picks a port), print `READY <port>`, serve
//! barewire-peer check HOST:PORT  WRITE, READ and SEND against a serving peer, bytes checked
//! ```
//!
//! The driver comes from `BAREWIRE_DRIVER` / `BAREWIRE_DEVICE` (see barewire-drivers).
//!
//! A serving peer registers two regions and sends their descriptors (20 bytes each) in the
//! connection's private data: region 0, `REGION_LEN` bytes with every remote right, lying
//! between two guard areas that no peer may reach; and region 1, 4 KiB, remote read only,
//! filled with 0x5a. Each connection keeps receives posted and answers each Send:
//! `?guards` gets `guards ok` or `guards BAD`; `?window` binds a window over region 0 for
//! this connection alone and gets its descriptor (20 bytes), or `no window: <why>`;
//! `?region` registers a fresh 4 KiB region with every remote right, filled with 0x3c, and gets
//! its descriptor; `?drop` deregisters (and frees) the regions `?region` made and gets
//! `dropped`; `?sum <offset> <length>` (decimal) gets `sum <hash>`, the 64-bit FNV-1a hash of
//! those bytes of region 0 as the peer reads them then (in hex, 16 digits), or `sum: <why>`;
//! anything else is echoed back; a Write with immediate gets `imm <value> <bytes>`.

use std::io::Write;
use std::rc::Rc;

use barewire_drivers::{
    connect, Access, Buffer, ConnectOptions, Device, DriverError, Endpoint, Listener,
    RegionDescriptor, Remote, WcOpcode, WcStatus,
};
use barewire_engine::{spawn_local, Runtime};

/// Length of region 0.
const REGION_LEN: usize = 17 << 20;
const GUARD: usize = 4096;
const GUARD_BYTE: u8 = 0xee;
const MSG: usize = 4096;
const RECVS: usize = 16;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rt = Runtime::builder()
        .cores(1)
        .pin(false)
        .build()
        .expect("runtime");
    let code = rt.block_on(async move {
        let r = match args.first().map(String::as_str) {
            Some("serve") => serve(args.get(1).and_then(|p| p.parse().ok()).unwrap_or(0)).await,
            Some("check") if args.len() == 2 => check(&args[1]).await,
            _ => {
                eprintln!("usage: barewire-peer serve [PORT] | barewire-peer check HOST:PORT");
                return 2;
            }
        };
        match r {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("barewire-peer: {e}");
                1
            }
        }
    });
    std::process::exit(code);
}

async fn serve(port: u16) -> Result<(), DriverError> {
    let dev = Rc::new(Device::from_env()?);
    let pd = Rc::new(dev.alloc_pd()?);
    let all =
        Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    // Region 0 in the middle of a larger allocation whose ends are guard bytes.
    let whole = Buffer::new(&pd, REGION_LEN + 2 * GUARD, 4096, Access::LOCAL_WRITE)?;
    whole.write_at(0, &[GUARD_BYTE; GUARD]);
    whole.write_at(GUARD + REGION_LEN, &[GUARD_BYTE; GUARD]);
    // SAFETY: the bytes belong to `whole`, which outlives this region (both live until exit).
    let region0 = unsafe { pd.register(whole.region().addr().add(GUARD), REGION_LEN, all) }?;
    let region1 = Buffer::new(&pd, 4096, 64, Access::REMOTE_READ)?;
    region1.write_at(0, &[0x5a; 4096]);
    let mut private = region0.descriptor().to_bytes().to_vec();
    private.extend_from_slice(&region1.descriptor().to_bytes());
    let opts = ConnectOptions {
        private_data: private,
        ..dev.connect_options()
    };
    let l = Listener::bind(&dev, ([0, 0, 0, 0], port).into(), &opts)?;
    println!("READY {}", l.port());
    let _ = std::io::stdout().flush();
    let keep = Rc::new((whole, region0, region1));
    loop {
        let (scq, rcq) = (dev.create_cq(1024)?, dev.create_cq(1024)?);
        let (qp, _) = match l.accept(&pd, &scq, &rcq).await {
            Ok(c) => c,
            Err(e) => {
                eprintln!("barewire-peer: accept: {e}");
                continue;
            }
        };
        let pd = pd.clone();
        let keep = keep.clone();
        spawn_local(async move {
            match answer(Endpoint::new(qp, scq, rcq), &pd, &keep.0, &keep.1).await {
                // The peer hung up: our posted receives flush.
                Err(DriverError::Completion {
                    status: WcStatus::WrFlushErr | WcStatus::RetryExcErr,
                    ..
                })
                | Ok(()) => {}
                Err(e) => eprintln!("barewire-peer: connection ended: {e}"),
            }
        });
    }
}

/// Keeps receives posted and answers each message (see the module docs).
async fn answer(
    ep: Endpoint,
    pd: &barewire_drivers::ProtectionDomain,
    whole: &Rc<Buffer>,
    region0: &barewire_drivers::MemoryRegion,
) -> Result<(), DriverError> {
    // Windows bound for this connection: they live as long as it does.
    let mut windows = Vec::new();
    // Regions made by `?region`, until `?drop`.
    let mut fresh = Vec::new();
    let rx = Buffer::new(pd, MSG * RECVS, 64, Access::LOCAL_WRITE)?;
    let tx = Buffer::new(pd, MSG, 64, Access::LOCAL_WRITE)?;
    let mut pending: std::collections::VecDeque<_> = (0..RECVS)
        .map(|i| (i, ep.recv(&rx, i * MSG, MSG)))
        .collect();
    while let Some((slot, op)) = pending.pop_front() {
        let wc = op.await?;
        let imm = wc.opcode == WcOpcode::RecvRdmaWithImm;
        // A Write with immediate places nothing in the receive: its length is the Write's.
        let mut msg = vec![0u8; if imm { 0 } else { wc.byte_len as usize }];
        rx.read_at(slot * MSG, &mut msg);
        pending.push_back((slot, ep.recv(&rx, slot * MSG, MSG)));
        let reply = if imm {
            format!("imm {} {}", wc.imm.unwrap_or(0), wc.byte_len).into_bytes()
        } else if msg == b"?window" {
            let all = Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
            match region0.bind_window(ep.qp(), all) {
                Ok(w) => {
                    let d = w.descriptor().to_bytes().to_vec();
                    windows.push(w);
                    d
                }
                Err(e) => format!("no window: {e}").into_bytes(),
            }
        } else if msg == b"?region" {
            let all = Access::LOCAL_WRITE
                | Access::REMOTE_WRITE
                | Access::REMOTE_READ
                | Access::REMOTE_ATOMIC;
            let b = Buffer::new(pd, 4096, 64, all)?;
            b.write_at(0, &[0x3c; 4096]);
            let d = b.descriptor().to_bytes().to_vec();
            fresh.push(b);
            d
        } else if msg == b"?drop" {
            fresh.clear();
            b"dropped".to_vec()
        } else if let Some(range) = msg.strip_prefix(b"?sum ") {
            sum(whole, range).into_bytes()
        } else if msg == b"?guards" {
            let mut g = vec![0u8; GUARD];
            let mut ok = true;
            for at in [0, GUARD + REGION_LEN] {
                whole.read_at(at, &mut g);
                ok &= g.iter().all(|&b| b == GUARD_BYTE);
            }
            if ok {
                b"guards ok".to_vec()
            } else {
                b"guards BAD".to_vec()
            }
        } else {
            msg
        };
        tx.write_at(0, &reply);
        ep.send(&tx, 0, reply.len()).await?;
    }
    Ok(())
}

/// The answer to `?sum <offset> <length>`: the FNV-1a hash of those bytes of region 0 (which
/// starts `GUARD` bytes into `whole`).
fn sum(whole: &Buffer, range: &[u8]) -> String {
    let parsed = std::str::from_utf8(range).ok().and_then(|r| {
        let (off, len) = r.split_once(' ')?;
        let (off, len) = (off.parse::<usize>().ok()?, len.parse::<usize>().ok()?);
        (off.checked_add(len)? <= REGION_LEN).then_some((off, len))
    });
    let Some((off, len)) = parsed else {
        return format!("sum: not an offset and a length within {REGION_LEN} bytes");
    };
    let mut bytes = vec![0u8; len];
    whole.read_at(GUARD + off, &mut bytes);
    format!("sum {:016x}", fnv1a(&bytes))
}

/// 64-bit FNV-1a.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Connects to a serving peer and checks WRITE, READ and SEND with their bytes.
async fn check(addr: &str) -> Result<(), DriverError> {
    let addr = addr
        .parse()
        .map_err(|e| DriverError::Connect(format!("{addr}: {e}")))?;
    let dev = Device::from_env()?;
    let pd = dev.alloc_pd()?;
    let (scq, rcq) = (dev.create_cq(256)?, dev.create_cq(256)?);
    let (qp, private) = connect(addr, &pd, &scq, &rcq, &dev.connect_options()).await?;
    let remote = RegionDescriptor::from_bytes(&private)
        .ok_or_else(|| DriverError::Connect("the peer sent no region descriptor".into()))?;
    let ep = Endpoint::new(qp, scq, rcq);
    let buf = Buffer::new(&pd, 3 * 65536, 64, Access::LOCAL_WRITE)?;
    let pattern: Vec<u8> = (0..65536u32).map(|i| (i * 7 + 3) as u8).collect();
    buf.write_at(0, &pattern);
    ep.write(&buf, 0, pattern.len(), Remote::at(remote, 512))
        .await?;
    println!("WRITE 65536 bytes: ok");
    ep.read(&buf, 65536, pattern.len(), Remote::at(remote, 512))
        .await?;
    let mut back = vec![0u8; pattern.len()];
    buf.read_at(65536, &mut back);
    if back != pattern {
        return Err(DriverError::Connect(
            "READ returned other bytes than were written".into(),
        ));
    }
    println!("READ 65536 bytes: ok (same bytes)");
    let reply = ep.recv(&buf, 131072, 4096);
    buf.write_at(0, b"hello over SEND");
    ep.send(&buf, 0, 15).await?;
    let wc = reply.await?;
    let mut echo = vec![0u8; wc.byte_len as usize];
    buf.read_at(131072, &mut echo);
    if echo != b"hello over SEND" {
        return Err(DriverError::Connect(format!(
            "SEND echo came back as {echo:?}"
        )));
    }
    println!("SEND/RECV echo: ok");
    Ok(())
}
