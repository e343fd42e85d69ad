//! Independent conformance: barewire's codec output, written as a pcap of real TCP
//! conversations, must decode in Wireshark's iWARP dissectors (tshark) with no malformed frame
//! and no bad CRC, and tshark must read back the opcode, STag, TO, QN, MSN and MO we encoded.
//!
//! Covers every RDMAP opcode, MPA revisions 1 and 2, CRC on and off, a rejected handshake,
//! segmented messages, a Terminate with header copies, and the atomics. Without tshark the
//! tests print why they skip, except under CI (CI=true), where the README's test command
//! installs tshark and its absence is a failure.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use barewire_soft_rdma::wire::*;

const MULPDU: usize = 64;

/// What one FPDU should decode as: (opcode, stag, to, qn, msn, mo); absent fields are None.
type Expect = (
    u8,
    Option<u32>,
    Option<u64>,
    Option<u32>,
    Option<u32>,
    Option<u32>,
);

struct Tcp {
    seq: [u32; 2],
    ports: [u16; 2],
    packets: Vec<Vec<u8>>,
}

impl Tcp {
    fn new(port: u16) -> Tcp {
        let mut t = Tcp {
            seq: [1000, 50_000],
            ports: [port, 9999],
            packets: Vec::new(),
        };
        t.raw(0, &[], true, false);
        t.raw(1, &[], true, true);
        t.raw(0, &[], false, true);
        t
    }

    /// Appends one TCP segment from side `from` (0 client, 1 server).
    fn raw(&mut self, from: usize, payload: &[u8], syn: bool, ack: bool) {
        let to = 1 - from;
        let ips = [[10, 0, 0, 1], [10, 0, 0, 2]];
        let macs = [[2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]];
        let mut b = etherparse::PacketBuilder::ethernet2(macs[from], macs[to])
            .ipv4(ips[from], ips[to], 64)
            .tcp(self.ports[from], self.ports[to], self.seq[from], 65535);
        if syn {
            b = b.syn();
        }
        if ack {
            b = b.ack(self.seq[to]);
        }
        if !payload.is_empty() {
            b = b.psh();
        }
        let mut out = Vec::with_capacity(b.size(payload.len()));
        b.write(&mut out, payload).unwrap();
        self.packets.push(out);
        self.seq[from] = self.seq[from].wrapping_add(payload.len() as u32 + syn as u32);
    }

    fn send(&mut self, from: usize, payload: &[u8]) {
        self.raw(from, payload, false, true);
    }
}

fn fpdu(seg: &Segment<'_>, body: &[u8], crc: bool) -> Vec<u8> {
    let mut out = Vec::new();
    Segment {
        payload: body,
        ..*seg
    }
    .encode_fpdu(crc, &mut out)
    .unwrap();
    out
}

/// One connection with every message kind; returns what each FPDU must decode as.
fn session(tcp: &mut Tcp, revision: u8, crc: bool) -> Vec<Expect> {
    let rev2 = (revision == 2).then_some(Rev2Params {
        ird: 8,
        ord: 8,
        p2p: true,
        rtr_zero_send: true,
        ..Rev2Params::default()
    });
    let req = MpaFrame {
        kind: MpaKind::Request,
        markers: false,
        crc,
        reject: false,
        revision,
        rev2,
        private_data: b"barewire",
    };
    let rep = MpaFrame {
        kind: MpaKind::Reply,
        ..req.clone()
    };
    let mut buf = [0u8; 600];
    let n = req.encode(&mut buf).unwrap();
    tcp.send(0, &buf[..n]);
    let n = rep.encode(&mut buf).unwrap();
    tcp.send(1, &buf[..n]);

    let mut expect = Vec::new();
    let mut msn = [1u32; QUEUES];
    let mut untagged = |tcp: &mut Tcp,
                        from: usize,
                        op: RdmapOpcode,
                        q: u32,
                        ulp: u32,
                        body: &[u8],
                        expect: &mut Vec<Expect>| {
        let m = msn[q as usize];
        msn[q as usize] += 1;
        // Only Sends are segmented; Read Requests, atomics and Terminates are single-segment
        // messages by definition.
        let mulpdu = if q == qn::SEND { MULPDU } else { usize::MAX };
        for (off, len, last) in split(body.len(), UNTAGGED_HEADER_LEN, mulpdu) {
            let seg = Segment {
                last,
                opcode: op,
                header: DdpHeader::Untagged {
                    ulp,
                    qn: q,
                    msn: m,
                    mo: off as u32,
                },
                payload: &[],
            };
            tcp.send(from, &fpdu(&seg, &body[off..off + len], crc));
            expect.push((op as u8, None, None, Some(q), Some(m), Some(off as u32)));
        }
    };
    let payload: Vec<u8> = (0..150u8).collect();
    untagged(
        tcp,
        0,
        RdmapOpcode::Send,
        qn::SEND,
        0,
        &payload,
        &mut expect,
    );
    untagged(
        tcp,
        0,
        RdmapOpcode::SendInvalidate,
        qn::SEND,
        0x1234_5678,
        b"inv",
        &mut expect,
    );
    untagged(tcp, 0, RdmapOpcode::SendSe, qn::SEND, 0, b"se", &mut expect);
    untagged(
        tcp,
        0,
        RdmapOpcode::SendSeInvalidate,
        qn::SEND,
        0x0bad_cafe,
        b"",
        &mut expect,
    );
    untagged(
        tcp,
        0,
        RdmapOpcode::ImmediateData,
        qn::SEND,
        0,
        &0xfeed_u64.to_be_bytes(),
        &mut expect,
    );
    untagged(
        tcp,
        0,
        RdmapOpcode::ImmediateDataSe,
        qn::SEND,
        0,
        &7u64.to_be_bytes(),
        &mut expect,
    );

    // A Write larger than one FPDU.
    let (stag, to) = (0xa1b2_c3d4u32, 0x7f00_0000_1000u64);
    for (off, len, last) in split(payload.len(), TAGGED_HEADER_LEN, MULPDU) {
        let seg = Segment {
            last,
            opcode: RdmapOpcode::Write,
            header: DdpHeader::Tagged {
                stag,
                to: to + off as u64,
            },
            payload: &[],
        };
        tcp.send(0, &fpdu(&seg, &payload[off..off + len], crc));
        expect.push((0, Some(stag), Some(to + off as u64), None, None, None));
    }

    let rr = ReadRequest {
        sink_stag: 0x1111_2222,
        sink_to: 0x4000,
        size: 100,
        source_stag: 0x3333_4444,
        source_to: 0x8000,
    };
    let mut body = [0u8; ReadRequest::LEN];
    rr.encode(&mut body);
    untagged(
        tcp,
        0,
        RdmapOpcode::ReadRequest,
        qn::READ_REQUEST,
        0,
        &body,
        &mut expect,
    );
    // The Read Response goes to the sink, in segments.
    for (off, len, last) in split(rr.size as usize, TAGGED_HEADER_LEN, MULPDU) {
        let seg = Segment {
            last,
            opcode: RdmapOpcode::ReadResponse,
            header: DdpHeader::Tagged {
                stag: rr.sink_stag,
                to: rr.sink_to + off as u64,
            },
            payload: &[],
        };
        tcp.send(1, &fpdu(&seg, &payload[off..off + len], crc));
        expect.push((
            2,
            Some(rr.sink_stag),
            Some(rr.sink_to + off as u64),
            None,
            None,
            None,
        ));
    }

    for op in [AtomicOp::FetchAdd, AtomicOp::CmpSwap] {
        let a = AtomicRequest {
            op,
            request_id: op as u32 + 1,
            stag: 0x5555_0000,
            to: 0x40,
            data: 3,
            data_mask: !0,
            compare: 9,
            compare_mask: !0,
        };
        let mut body = [0u8; AtomicRequest::LEN];
        a.encode(&mut body);
        untagged(
            tcp,
            0,
            RdmapOpcode::AtomicRequest,
            qn::ATOMIC_REQUEST,
            0,
            &body,
            &mut expect,
        );
        let r = AtomicResponse {
            request_id: a.request_id,
            original: 42,
        };
        let mut body = [0u8; AtomicResponse::LEN];
        r.encode(&mut body);
        untagged(
            tcp,
            1,
            RdmapOpcode::AtomicResponse,
            qn::ATOMIC_RESPONSE,
            0,
            &body,
            &mut expect,
        );
    }

    // A Terminate quoting a failing tagged DDP header and an RDMAP header.
    let bad = Segment {
        last: true,
        opcode: RdmapOpcode::Write,
        header: DdpHeader::Tagged {
            stag: 0xdead_beef,
            to: 0,
        },
        payload: &[],
    };
    let mut hdr = [0u8; UNTAGGED_HEADER_LEN];
    bad.encode_header(&mut hdr).unwrap();
    let term = Terminate {
        code: TermCode::rdmap(
            RdmapErrorType::RemoteProtection,
            RdmapErrorCode::InvalidStag,
        ),
        m: true,
        ddp: Some((100, hdr, TAGGED_HEADER_LEN)),
        rdmap: Some(body_of(&rr)),
    };
    let mut body = [0u8; 80];
    let n = term.encode(&mut body).unwrap();
    untagged(
        tcp,
        1,
        RdmapOpcode::Terminate,
        qn::TERMINATE,
        0,
        &body[..n],
        &mut expect,
    );
    expect
}

fn body_of(rr: &ReadRequest) -> [u8; ReadRequest::LEN] {
    let mut b = [0u8; ReadRequest::LEN];
    rr.encode(&mut b);
    b
}

fn rejected(tcp: &mut Tcp) {
    let req = MpaFrame {
        kind: MpaKind::Request,
        markers: false,
        crc: true,
        reject: false,
        revision: 2,
        rev2: Some(Rev2Params::default()),
        private_data: b"",
    };
    let rep = MpaFrame {
        kind: MpaKind::Reply,
        reject: true,
        private_data: b"no such service",
        ..req.clone()
    };
    let mut buf = [0u8; 600];
    let n = req.encode(&mut buf).unwrap();
    tcp.send(0, &buf[..n]);
    let n = rep.encode(&mut buf).unwrap();
    tcp.send(1, &buf[..n]);
}

fn write_pcap(path: &Path, conns: &[Tcp]) {
    let file = std::fs::File::create(path).unwrap();
    let header = pcap_file::pcap::PcapHeader {
        datalink: pcap_file::DataLink::ETHERNET,
        ..Default::default()
    };
    let mut w = pcap_file::pcap::PcapWriter::with_header(file, header).unwrap();
    let mut t = 0u64;
    for c in conns {
        for p in &c.packets {
            t += 10;
            w.write_packet(&pcap_file::pcap::PcapPacket::new(
                Duration::from_micros(t),
                p.len() as u32,
                p,
            ))
            .unwrap();
        }
    }
}

fn tshark_available() -> bool {
    let ok = Command::new("tshark")
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !ok {
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("tshark is missing under CI; the README's test command installs it");
        }
        eprintln!("SKIP: tshark is not installed (apt-get install tshark), so the independent iWARP decoder cannot run");
    }
    ok
}

fn tshark(pcap: &Path, args: &[&str]) -> String {
    let out = Command::new("tshark")
        .arg("-r")
        .arg(pcap)
        .args([
            "-o",
            "tcp.try_heuristic_first:TRUE",
            "--disable-heuristic",
            "rpcrdma_iwarp",
            "--disable-heuristic",
            "smb_direct_iwarp",
        ])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "tshark failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("barewire-{name}-{}.pcap", std::process::id()))
}

fn capture() -> (Vec<Tcp>, Vec<Expect>) {
    let mut conns = Vec::new();
    let mut expect = Vec::new();
    for (i, (rev, crc)) in [(1, false), (1, true), (2, false), (2, true)]
        .into_iter()
        .enumerate()
    {
        let mut tcp = Tcp::new(40_000 + i as u16);
        expect.extend(session(&mut tcp, rev, crc));
        conns.push(tcp);
    }
    let mut tcp = Tcp::new(41_000);
    rejected(&mut tcp);
    conns.push(tcp);
    (conns, expect)
}

/// tshark prints BASE_HEX fields with 0x and BASE_DEC fields plainly.
fn parse_u<T: TryFrom<u64>>(s: &str) -> Option<T> {
    let v = match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).ok()?,
        None => s.parse().ok()?,
    };
    T::try_from(v).ok()
}

/// Asserts tshark finds no malformed frame, no warning and no bad CRC in `pcap`; returns how
/// many CRCs it checked.
fn assert_clean(pcap: &Path) -> usize {
    let problems = tshark(
        pcap,
        &[
            "-Y",
            "_ws.malformed || _ws.expert.severity >= warning",
            "-T",
            "fields",
            "-e",
            "frame.number",
            "-e",
            "_ws.expert.message",
        ],
    );
    assert!(
        problems.trim().is_empty(),
        "tshark reported problems in {}:\n{problems}",
        pcap.display()
    );
    let (checked, bad) = crc_verdicts(pcap);
    assert_eq!(bad, 0, "no FPDU has a bad CRC ({checked} checked)");
    checked
}

/// Counts CRC verdicts in tshark's verbose MPA output: (checked, bad).
fn crc_verdicts(pcap: &Path) -> (usize, usize) {
    let verbose = tshark(pcap, &["-O", "iwarp_mpa"]);
    let checked = verbose.lines().filter(|l| l.contains("CRC check:")).count();
    let bad = verbose.lines().filter(|l| l.contains("Bad CRC")).count();
    (checked, bad)
}

#[test]
fn tshark_decodes_every_frame_we_encode() {
    if !tshark_available() {
        return;
    }
    let (conns, expect) = capture();
    let path = temp("conformance");
    write_pcap(&path, &conns);

    // 1. Nothing malformed, no CRC complaint.
    let checked = assert_clean(&path);
    assert!(checked > 0, "tshark checked the CRC of the CRC-on sessions");

    // 2. MPA frames: requests, replies, the rejection, CRC flags.
    let mpa = tshark(
        &path,
        &[
            "-Y",
            "iwarp_mpa.req || iwarp_mpa.rep",
            "-T",
            "fields",
            "-e",
            "iwarp_mpa.rev",
            "-e",
            "iwarp_mpa.crc_flag",
            "-e",
            "iwarp_mpa.rej_flag",
        ],
    );
    let rows: Vec<&str> = mpa.lines().collect();
    assert_eq!(rows.len(), 10, "5 requests and 5 replies:\n{mpa}");
    assert!(
        rows[9]
            .split('\t')
            .nth(2)
            .is_some_and(|r| r == "1" || r == "True"),
        "the last reply is a rejection: {}",
        rows[9]
    );

    // 3. Every FPDU's fields, in order.
    let fields = tshark(
        &path,
        &[
            "-Y",
            "iwarp_rdma",
            "-T",
            "fields",
            "-E",
            "occurrence=f",
            "-e",
            "iwarp_rdma.opcode",
            "-e",
            "iwarp_ddp.stag",
            "-e",
            "iwarp_ddp.tagged_offset",
            "-e",
            "iwarp_ddp.qn",
            "-e",
            "iwarp_ddp.msn",
            "-e",
            "iwarp_ddp.mo",
        ],
    );
    let got: Vec<Expect> = fields
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            (
                parse_u(f[0]).unwrap(),
                parse_u(f[1]),
                parse_u(f[2]),
                parse_u(f[3]),
                parse_u(f[4]),
                parse_u(f[5]),
            )
        })
        .collect();
    assert_eq!(
        got.len(),
        expect.len(),
        "one decoded FPDU per FPDU sent:\n{fields}"
    );
    for (i, (g, e)) in got.iter().zip(&expect).enumerate() {
        assert_eq!(g, e, "FPDU #{i}");
    }
    let _ = std::fs::remove_file(path);
}

/// The conformance check can fail: a flipped payload bit under CRC is reported by tshark.
#[test]
fn tshark_flags_a_corrupted_crc() {
    if !tshark_available() {
        return;
    }
    let mut tcp = Tcp::new(42_000);
    session(&mut tcp, 2, true);
    let path = temp("goodcrc");
    write_pcap(&path, std::slice::from_ref(&tcp));
    assert_eq!(crc_verdicts(&path).1, 0, "the untouched session is clean");
    let _ = std::fs::remove_file(&path);
    // Flip a byte just before the CRC of the first Send (packet 6: after the TCP and MPA
    // handshakes).
    let p = &mut tcp.packets[5];
    let n = p.len();
    p[n - 5] ^= 0x01;
    let path = temp("badcrc");
    write_pcap(&path, &[tcp]);
    let (_, bad) = crc_verdicts(&path);
    assert_eq!(bad, 1, "tshark reports exactly the corrupted FPDU's CRC");
    let _ = std::fs::remove_file(path);
}

/// A live session of the provider over loopback, captured while it runs, decodes cleanly too.
#[test]
fn a_live_provider_session_decodes_in_tshark() {
    use barewire_soft_rdma::provider::{connect, ConnectOptions, Listener};
    use barewire_soft_rdma::stream::{RecvWr, SendOp, SendWr, Sge};
    use barewire_soft_rdma::verbs::{Access, CompletionQueue, Device, WcStatus};

    if !tshark_available() {
        return;
    }
    let path = temp("live");
    let rt = barewire_engine::Runtime::builder()
        .cores(1)
        .sleeping()
        .build()
        .unwrap();
    let opts = ConnectOptions {
        mpa: MpaSettings {
            crc: true,
            ..MpaSettings::default()
        },
        ..ConnectOptions::default()
    };
    let l = rt
        .block_on(async { Listener::bind("127.0.0.1:0".parse().unwrap(), opts.clone()).unwrap() });
    let port = l.local_addr().unwrap().port();
    let mut cap = Command::new("tshark")
        .args(["-i", "lo", "-f", &format!("tcp port {port}"), "-w"])
        .arg(&path)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until tshark says it is capturing.
    {
        use std::io::BufRead;
        let mut err = std::io::BufReader::new(cap.stderr.take().unwrap());
        let mut line = String::new();
        let t0 = std::time::Instant::now();
        loop {
            line.clear();
            if err.read_line(&mut line).unwrap() == 0 || t0.elapsed() > Duration::from_secs(20) {
                let _ = cap.kill();
                let _ = cap.wait();
                if std::env::var("CI").as_deref() == Ok("true") {
                    panic!("tshark could not capture on lo");
                }
                eprintln!("SKIP: tshark cannot capture on lo here");
                return;
            }
            // "Capturing on" comes before the capture really runs; "Capture started" after.
            if line.contains("Capture started") {
                break;
            }
        }
        std::thread::spawn(move || std::io::copy(&mut err, &mut std::io::sink()));
        std::thread::sleep(Duration::from_millis(300));
    }
    rt.block_on(async {
        let (a, b) = (Device::new(), Device::new());
        let (apd, bpd) = (a.alloc_pd(), b.alloc_pd());
        let (ascq, arcq, bscq, brcq) = (
            CompletionQueue::new(64),
            CompletionQueue::new(64),
            CompletionQueue::new(64),
            CompletionQueue::new(64),
        );
        let server = barewire_engine::spawn_local(async move {
            let r = l.accept(&bpd, &bscq, &brcq).await.unwrap();
            (r, bpd, bscq, brcq)
        });
        let (qa, _) = connect(
            format!("127.0.0.1:{port}").parse().unwrap(),
            &apd,
            &ascq,
            &arcq,
            opts,
        )
        .await
        .unwrap();
        let ((qb, _), bpd, _bscq, brcq) = server.await.unwrap();
        let mut abuf = vec![7u8; 100_000];
        let mut bbuf = vec![0u8; 100_000];
        // SAFETY: both buffers outlive their regions (dropped at the end of this block).
        let amr =
            unsafe { apd.register(abuf.as_mut_ptr(), abuf.len(), Access::LOCAL_WRITE) }.unwrap();
        // SAFETY: as above.
        let bmr = unsafe {
            bpd.register(
                bbuf.as_mut_ptr(),
                bbuf.len(),
                Access::LOCAL_WRITE
                    | Access::REMOTE_WRITE
                    | Access::REMOTE_READ
                    | Access::REMOTE_ATOMIC,
            )
        }
        .unwrap();
        let sge = |off: u64, len: u32| Sge {
            addr: amr.addr() as u64 + off,
            len,
            lkey: amr.stag(),
        };
        qb.post_recv(RecvWr {
            wr_id: 1,
            sges: [Sge {
                addr: bmr.addr() as u64,
                len: 4096,
                lkey: bmr.stag(),
            }]
            .into(),
        })
        .unwrap();
        let ops = [
            SendOp::Send {
                solicited: false,
                invalidate: None,
            },
            SendOp::Write {
                remote_addr: bmr.addr() as u64 + 8192,
                rkey: bmr.stag(),
            },
            SendOp::Read {
                remote_addr: bmr.addr() as u64 + 8192,
                rkey: bmr.stag(),
            },
            SendOp::FetchAdd {
                remote_addr: bmr.addr() as u64 + 4096,
                rkey: bmr.stag(),
                add: 3,
            },
        ];
        for (i, op) in ops.into_iter().enumerate() {
            let len = match op {
                SendOp::FetchAdd { .. } => 8,
                SendOp::Send { .. } => 1000,
                _ => 50_000,
            };
            qa.post_send(SendWr {
                wr_id: i as u64,
                op,
                sges: [sge(50_000, len)].into(),
                signaled: true,
                fence: false,
            })
            .unwrap();
            let wc = barewire_engine::time::timeout(Duration::from_secs(5), ascq.next())
                .await
                .unwrap();
            assert_eq!(wc.status, WcStatus::Success, "{op:?}");
        }
        assert_eq!(brcq.next().await.status, WcStatus::Success);
        drop((amr, bmr));
        barewire_engine::time::sleep(Duration::from_millis(200)).await;
    });
    // SAFETY: SIGINT to our own child makes tshark finish the file.
    unsafe { libc::kill(cap.id() as i32, libc::SIGINT) };
    cap.wait().unwrap();
    let checked = assert_clean(&path);
    assert!(checked > 10, "CRCs were checked ({checked})");
    let ops = tshark(
        &path,
        &[
            "-Y",
            "iwarp_rdma",
            "-T",
            "fields",
            "-e",
            "iwarp_rdma.opcode",
        ],
    );
    for op in ["0x00", "0x01", "0x02", "0x03", "0x0a", "0x0b"] {
        assert!(
            ops.lines()
                .flat_map(|l| l.split(','))
                .any(|o| o.trim() == op),
            "opcode {op} seen live:\n{ops}"
        );
    }
    eprintln!(
        "live capture: {checked} CRCs checked, {} iWARP frames",
        ops.lines().count()
    );
    let _ = std::fs::remove_file(path);
}
