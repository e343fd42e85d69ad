//! The server side: it accepts the client's connection, lays out its buffer as the client's
//! private data asks, and answers the test (credits for bandwidth, echoes for latency).

use super::*;

pub(super) fn server(args: &RunArgs) -> Result<(), String> {
    let out = server_core(args);
    write_trace(args, "server")?;
    out
}

fn server_core(args: &RunArgs) -> Result<(), String> {
    let cpu = args.cpus.as_ref().map(|c| *c.last().unwrap());
    runtime(cpu, args)?.block_on(async {
        let dev = open_device(&args.driver)?;
        let pd = dev.alloc_pd().map_err(|e| e.to_string())?;
        let buf = Buffer::new(&pd, crate::perf::cli::MAX_SIZE)?;
        let desc = buf.mr().descriptor();
        // One client opens every queue pair (`--qps`, up to u16::MAX): no per-source cap below it.
        let most = usize::from(u16::MAX);
        let opts = ConnectOptions {
            limits: ListenerLimits {
                max_connections: most,
                max_connections_per_source: most,
                ..ListenerLimits::default()
            },
            ..options(&dev, args.crc, desc.to_bytes().to_vec())
        };
        let l = Listener::bind(&dev, SocketAddr::from(([0, 0, 0, 0], args.port)), &opts)
            .map_err(|e| format!("listen on port {}: {e}", args.port))?;
        let port = l.port();
        if args.announce {
            println!("READY {port}");
            let _ = std::io::stdout().flush();
        } else {
            eprintln!("barewire-perf: waiting for a client on port {port}");
        }
        let (scq, rcq) = cqs(&dev)?;
        let (qp, data) = l
            .accept(&pd, &scq, &rcq)
            .await
            .map_err(|e| format!("accept: {e}"))?;
        let (plan, remote) = Plan::decode(&data)?;
        // `--qps N`: the client's other connections, on the same completion queues; the
        // one-sided tests ask nothing more of the server than to keep them open until the
        // client hangs up, which flushes the one receive each keeps posted.
        let mut more = Vec::new();
        for _ in 1..plan.qps {
            let (qp, _) = l
                .accept(&pd, &scq, &rcq)
                .await
                .map_err(|e| format!("accept: {e}"))?;
            post_recv(&qp, 0, buf.sge(buf.recv_area(), 8))?;
            more.push(qp);
        }
        serve(&plan, &qp, &buf, &remote, &rcq).await?;
        let mut flushed = 0;
        while flushed < more.len() {
            if rcq.next().await.status != WcStatus::Success {
                flushed += 1;
            }
        }
        Ok(())
    })
}

/// The server's part: answer ping-pongs, keep receives posted and return credits, then wait
/// for the client to hang up.
async fn serve(
    plan: &Plan,
    qp: &QueuePair,
    buf: &Buffer,
    remote: &RegionDescriptor,
    rcq: &CompletionQueue,
) -> Result<(), String> {
    let max = *plan.sizes.iter().max().unwrap();
    let recvs = if plan.test == Test::SendBw {
        RX_DEPTH
    } else {
        1
    };
    for i in 0..recvs {
        post_recv(qp, i, buf.sge(buf.recv_area(), max))?;
    }
    // Tell the client our receives are posted.
    buf.write_u64(READY_SRC, 1);
    let ready = SendOp::Write {
        remote_addr: remote.addr + READY as u64,
        rkey: remote.rkey,
    };
    post_send(qp, wr(0, ready, buf.sge(buf.at(READY_SRC), 8), false))?;
    let to_client = |off: u64| SendOp::Write {
        remote_addr: remote.addr + off,
        rkey: remote.rkey,
    };
    // (After the ready flag, so that on a transport that cannot map, the client says so.)
    let mapped = floor_map(qp, buf, remote, plan.floor_slices).await?;
    let mut counter = 0u64;
    match plan.test {
        Test::WriteLat => {
            let looks = spin_looks(qp.transport());
            for &size in &plan.sizes {
                let warm = warmup(plan.iters);
                // `--floor-slices`: the client's receive area, for the bare stores.
                let store = mapped.as_ref().map(|m| m.span(CTRL, size));
                for i in 0..warm + plan.iters {
                    counter += 1;
                    let v = (counter % 255 + 1) as u8;
                    wait_byte(buf, buf.recv_area() + size as u64 - 1, v, looks).await;
                    buf.set_byte(buf.send_area() + size as u64 - 1, v);
                    match &store {
                        Some(span) if crate::perf::slices::stored(i, warm, plan.floor_slices) => {
                            span.write(0, buf.send_bytes(size))
                        }
                        _ => {
                            let op = to_client(CTRL as u64);
                            post_send(qp, wr(0, op, buf.sge(buf.send_area(), size), false))?;
                        }
                    }
                }
            }
        }
        Test::SendLat => {
            for &size in &plan.sizes {
                for _ in 0..warmup(plan.iters) + plan.iters {
                    ok(rcq.next().await, "receive")?;
                    post_recv(qp, 0, buf.sge(buf.recv_area(), max))?;
                    let op = SendOp::Send {
                        solicited: false,
                        invalidate: None,
                    };
                    post_send(qp, wr(0, op, buf.sge(buf.send_area(), size), false))?;
                }
            }
        }
        Test::SendBw => {
            let mut received = 0u64;
            while rcq.next().await.status == WcStatus::Success {
                post_recv(qp, received, buf.sge(buf.recv_area(), max))?;
                received += 1;
                if received % CREDIT_EVERY == 0 {
                    buf.write_u64(CREDIT_SRC, received);
                    let op = to_client(CREDITS as u64);
                    post_send(qp, wr(0, op, buf.sge(buf.at(CREDIT_SRC), 8), false))?;
                }
            }
            return Ok(());
        }
        _ => {}
    }
    // One-sided tests need nothing from us: the provider's poller serves them. Wait for the
    // client to hang up, which flushes the receive we keep posted.
    while rcq.next().await.status == WcStatus::Success {}
    Ok(())
}
