//! The client side, which measures: it connects, runs the test's iterations and turns them
//! into an [`Outcome`].

use super::*;

pub(super) fn client(args: &RunArgs, addr: SocketAddr) -> Result<Outcome, String> {
    let out = client_core(args, addr);
    write_trace(args, "client")?;
    out
}

fn client_core(args: &RunArgs, addr: SocketAddr) -> Result<Outcome, String> {
    let cpu = args.cpus.as_ref().map(|c| c[0]);
    runtime(cpu, args)?.block_on(async {
        let dev = open_device(&args.driver)?;
        let pd = dev.alloc_pd().map_err(|e| e.to_string())?;
        let max = *args.sizes.iter().max().unwrap();
        let buf = Buffer::new(&pd, max)?;
        let plan = Plan::of(args);
        let (scq, rcq) = cqs(&dev)?;
        let opts = options(&dev, args.crc, plan.encode(&buf.mr().descriptor()));
        let (qp, data) = connect(addr, &pd, &scq, &rcq, &opts)
            .await
            .map_err(|e| format!("connect to {addr}: {e}"))?;
        let remote = RegionDescriptor::from_bytes(&data)
            .ok_or("the server's private data is not a region descriptor")?;
        // `--qps N`: N - 1 more connections, sharing the first one's completion queues.
        let mut qps = vec![qp.clone()];
        for _ in 1..args.qps {
            let (q, _) = connect(addr, &pd, &scq, &rcq, &opts)
                .await
                .map_err(|e| format!("connect to {addr}: {e}"))?;
            qps.push(q);
        }
        if args.test == Test::SendLat {
            post_recv(&qp, 0, buf.sge(buf.recv_area(), max))?;
        }
        // Wait until the server's receives are posted.
        let t0 = Instant::now();
        while buf.read_u64(READY) != 1 {
            if t0.elapsed() > Duration::from_secs(10) {
                return Err("the server did not get ready within 10 s".into());
            }
            yield_now().await;
        }
        let c = Client {
            args,
            qp: &qp,
            qps: &qps,
            scq: &scq,
            rcq: &rcq,
            buf: &buf,
            remote,
            counter: Cell::new(0),
            sends: Cell::new(0),
        };
        let mut out = Outcome::default();
        let table = !args.json && !args.quiet;
        if table {
            println!("{RULE}");
            println!(
                "{}",
                if args.test.is_bw() {
                    BW_HEADER
                } else {
                    LAT_HEADER
                }
            );
        }
        let show = |json: String, line: String| {
            if !args.quiet {
                println!("{}", if args.json { json } else { line });
            }
        };
        for &size in &args.sizes {
            if args.test.is_bw() {
                let row = c.bandwidth(size).await?;
                show(row.json(args.test.name()), row.line());
                out.bw.push(row);
            } else {
                let (h, sliced) = c.latency(size).await?;
                let row = LatRow::from_histogram(size, &h);
                show(row.json(args.test.name()), row.line());
                out.lat.push((row, h));
                if let Some(s) = sliced {
                    show(s.json(), s.line());
                    out.slices.push(s);
                }
            }
            let _ = std::io::stdout().flush();
        }
        if table {
            println!("{RULE}");
        }
        for q in &qps {
            q.disconnect();
        }
        Ok(out)
    })
}

struct Client<'a> {
    args: &'a RunArgs,
    qp: &'a QueuePair,
    /// Every connection (the first is `qp`); bandwidth tests spread their batches over them.
    qps: &'a [QueuePair],
    scq: &'a CompletionQueue,
    rcq: &'a CompletionQueue,
    buf: &'a Buffer,
    remote: RegionDescriptor,
    counter: Cell<u64>,
    /// Sends so far (all sizes), against the server's credits.
    sends: Cell<u64>,
}

/// A run's progress on stderr (indicatif): drawn once the run has taken over two seconds,
/// and never when stderr is not a terminal (indicatif's stderr target hides itself then) or
/// the caller asked for quiet (`compare` draws its own).
struct Progress {
    bar: indicatif::ProgressBar,
    start: Instant,
    quiet: bool,
}

impl Progress {
    /// `len` steps of `unit` (iterations, or milliseconds of a `-D` run).
    fn new(len: u64, unit: &str, quiet: bool) -> Progress {
        let bar = indicatif::ProgressBar::hidden();
        bar.set_length(len);
        if let Ok(style) = indicatif::ProgressStyle::with_template(&format!(
            "{{msg}} [{{bar:30}}] {{pos}}/{{len}} {unit}, ETA {{eta}}"
        )) {
            bar.set_style(style.progress_chars("=> "));
        }
        Progress {
            bar,
            start: Instant::now(),
            quiet,
        }
    }

    fn tick(&mut self, pos: u64, what: impl FnOnce() -> String) {
        if self.bar.is_hidden() && !self.quiet && self.start.elapsed() > Duration::from_secs(2) {
            self.bar
                .set_draw_target(indicatif::ProgressDrawTarget::stderr_with_hz(4));
        }
        if !self.bar.is_hidden() {
            self.bar.set_position(pos);
            self.bar.set_message(what());
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.bar.finish_and_clear();
    }
}

impl Client<'_> {
    /// One size's latency: the histogram of its iterations' times (nanoseconds), and with
    /// `--floor-slices` the slices' summary (the histogram then holds the WRITE's alone).
    async fn latency(
        &self,
        size: usize,
    ) -> Result<(Histogram<u64>, Option<crate::perf::slices::Summary>), String> {
        let a = self.args;
        let (buf, qp) = (self.buf, self.qp);
        let warm = warmup(a.iters);
        // Counter ticks per iteration, kept raw in memory allocated before the loop and turned
        // into a histogram of nanoseconds after it, as perftest keeps its cycle counts: the
        // timed loop does one store per iteration, no arithmetic on floats, no histogram.
        let mut ticks: Vec<u64> = Vec::with_capacity(a.iters as usize);
        let remote_recv = self.remote.addr + CTRL as u64;
        let rkey = self.remote.rkey;
        let mut progress = Progress::new(a.iters, "iterations", a.quiet);
        // One cycle count per iteration, as perftest takes (get_cycles) and reports the
        // differences: an iteration's time runs from the end of the one before.
        let clock = Cycles::calibrate();
        // Each test runs its own loop (the same timing code around each, from `timed!`), so an
        // iteration does only its test's work: no dispatch on the test, and the parts of its
        // request that never change built once before the loop, as perftest posts one
        // prepared request over and over.
        macro_rules! timed {
            (|$i:ident| $body:block) => {{
                let mut t = Cycles::now();
                for $i in 0..warm + a.iters {
                    if a.gap_us > 0 {
                        barewire_engine::time::sleep(Duration::from_micros(a.gap_us)).await;
                        t = Cycles::now();
                    }
                    $body
                    let now = Cycles::now();
                    if $i >= warm {
                        ticks.push(now.wrapping_sub(t));
                        if ($i - warm) % 4096 == 0 {
                            progress.tick($i + 1 - warm, || format!("{} {size} B", a.test));
                        }
                    }
                    t = now;
                }
            }};
        }
        match a.test {
            Test::WriteLat => {
                let op = SendOp::Write {
                    remote_addr: remote_recv,
                    rkey,
                };
                let (src, last) = (buf.send_area(), buf.send_area() + size as u64 - 1);
                let polled = buf.recv_area() + size as u64 - 1;
                let looks = spin_looks(qp.transport());
                let mapped = floor_map(qp, buf, &self.remote, a.floor_slices).await?;
                match mapped.as_ref().map(|m| m.span(CTRL, size)) {
                    None => timed!(|i| {
                        self.counter.set(self.counter.get() + 1);
                        let v = (self.counter.get() % 255 + 1) as u8;
                        buf.set_byte(last, v);
                        post_send(qp, wr(i, op, buf.sge(src, size), false))?;
                        wait_byte(buf, polled, v, looks).await;
                    }),
                    // The same, with every other slice a bare store into the server's mapped
                    // receive area instead of the WRITE (the server answers in kind).
                    Some(span) => timed!(|i| {
                        self.counter.set(self.counter.get() + 1);
                        let v = (self.counter.get() % 255 + 1) as u8;
                        buf.set_byte(last, v);
                        if crate::perf::slices::stored(i, warm, a.floor_slices) {
                            span.write(0, buf.send_bytes(size));
                        } else {
                            post_send(qp, wr(i, op, buf.sge(src, size), false))?;
                        }
                        wait_byte(buf, polled, v, looks).await;
                    }),
                }
            }
            Test::SendLat => {
                let op = SendOp::Send {
                    solicited: false,
                    invalidate: None,
                };
                timed!(|i| {
                    post_send(qp, wr(i, op, buf.sge(buf.send_area(), size), false))?;
                    ok(self.rcq.next().await, "receive")?;
                    post_recv(qp, i, buf.sge(buf.recv_area(), buf.max))?;
                })
            }
            Test::ReadLat => {
                let op = SendOp::Read {
                    remote_addr: remote_recv,
                    rkey,
                };
                timed!(|i| {
                    post_send(qp, wr(i, op, buf.sge(buf.recv_area(), size), true))?;
                    ok(self.scq.next().await, "read")?;
                })
            }
            Test::AtomicLat => {
                let remote_addr = self.remote.addr + ATOMIC as u64;
                let result = buf.at(ATOMIC_RESULT);
                let check = |i: u64| {
                    let got = buf.read_u64(ATOMIC_RESULT);
                    if got == i {
                        Ok(())
                    } else {
                        Err(format!(
                            "atomic {i}: the remote counter held {got}, expected {i}"
                        ))
                    }
                };
                match a.atomic {
                    AtomicOp::FetchAdd => {
                        let op = SendOp::FetchAdd {
                            remote_addr,
                            rkey,
                            add: 1,
                        };
                        timed!(|i| {
                            post_send(qp, wr(i, op, buf.sge(result, 8), true))?;
                            ok(self.scq.next().await, "atomic")?;
                            check(i)?;
                        })
                    }
                    AtomicOp::CmpSwap => timed!(|i| {
                        let op = SendOp::CmpSwap {
                            remote_addr,
                            rkey,
                            compare: i,
                            swap: i + 1,
                        };
                        post_send(qp, wr(i, op, buf.sge(result, 8), true))?;
                        ok(self.scq.next().await, "atomic")?;
                        check(i)?;
                    }),
                }
            }
            _ => unreachable!("bandwidth test in the latency loop"),
        }
        let ns: Vec<u64> = ticks
            .into_iter()
            .map(|v| {
                let ns = clock.ns(v);
                if a.test.is_ping_pong() {
                    ns / 2
                } else {
                    ns
                }
            })
            .collect();
        let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).unwrap();
        for (j, &v) in ns.iter().enumerate() {
            // With slices, the histogram is the WRITE's alone.
            if a.floor_slices > 0 && crate::perf::slices::stored(j as u64, 0, a.floor_slices) {
                continue;
            }
            h.record(v.max(1)).map_err(|e| e.to_string())?;
        }
        let sliced = match a.floor_slices {
            0 => None,
            n => Some(
                crate::perf::slices::Summary::of(&ns, n, size)
                    .ok_or("--floor-slices: fewer iterations (-n) than two slices")?,
            ),
        };
        Ok((h, sliced))
    }

    async fn bandwidth(&self, size: usize) -> Result<BwRow, String> {
        let a = self.args;
        let buf = self.buf;
        // perftest's CQ moderation: one signaled request per batch. With several queue pairs
        // (`--qps`), each has `-t` requests in flight and batches go to each in turn.
        let batch = (a.tx_depth as u64).min(16);
        let depth = (a.tx_depth as u64).max(batch) * self.qps.len() as u64;
        let mut turn = 0usize;
        let target = a.iters.div_ceil(batch) * batch;
        let deadline = a.duration.map(Duration::from_secs_f64);
        let remote_recv = self.remote.addr + CTRL as u64 + u64::from(a.remote_offset);
        let rkey = self.remote.rkey;
        let (mut posted, mut done) = (0u64, 0u64);
        let mut marks: Vec<(Instant, u64)> = Vec::with_capacity(1024);
        let mut progress = match deadline {
            Some(d) => Progress::new(d.as_millis() as u64, "ms", a.quiet),
            None => Progress::new(target, "messages", a.quiet),
        };
        let t0 = Instant::now();
        marks.push((t0, 0));
        loop {
            let more = |posted: u64| match deadline {
                Some(d) => t0.elapsed() < d,
                None => posted < target,
            };
            while more(posted) && posted - done + batch <= depth {
                if a.test == Test::SendBw {
                    // Credits: the server has (re)posted this many receives beyond its first
                    // RX_DEPTH; never send into a receive queue that might be empty.
                    if self.sends.get() + batch > buf.read_u64(CREDITS) + RX_DEPTH {
                        break;
                    }
                }
                let qp = &self.qps[turn % self.qps.len()];
                turn += 1;
                for k in 0..batch {
                    let op = match a.test {
                        Test::WriteBw => SendOp::Write {
                            remote_addr: remote_recv,
                            rkey,
                        },
                        Test::ReadBw => SendOp::Read {
                            remote_addr: remote_recv,
                            rkey,
                        },
                        _ => SendOp::Send {
                            solicited: false,
                            invalidate: None,
                        },
                    };
                    let local = if a.test == Test::ReadBw {
                        buf.recv_area()
                    } else {
                        buf.send_area()
                    };
                    post_send(qp, wr(posted, op, buf.sge(local, size), k == batch - 1))?;
                    posted += 1;
                    self.sends.set(self.sends.get() + 1);
                }
            }
            if done == posted {
                if !more(posted) {
                    break;
                }
                // Waiting for credits only.
                yield_now().await;
                continue;
            }
            ok(self.scq.next().await, a.test.name())?;
            done += batch;
            let now = Instant::now();
            marks.push((now, done));
            let pos = match deadline {
                Some(_) => now.duration_since(t0).as_millis() as u64,
                None => done,
            };
            progress.tick(pos, || {
                let mib = done as f64 * size as f64 / (1 << 20) as f64;
                format!(
                    "{} {size} B, {:.0} MiB/s",
                    a.test,
                    mib / now.duration_since(t0).as_secs_f64()
                )
            });
        }
        let secs = marks.last().unwrap().0.duration_since(t0).as_secs_f64();
        let mib = |n: u64| n as f64 * size as f64 / (1 << 20) as f64;
        let avg = mib(done) / secs;
        Ok(BwRow {
            bytes: size,
            iters: done,
            peak: peak(&marks, size).unwrap_or(avg).max(avg),
            avg,
            mpps: done as f64 / secs / 1e6,
        })
    }
}

/// The best bandwidth over any window of at least 10 ms between two completion marks, MiB/s.
fn peak(marks: &[(Instant, u64)], size: usize) -> Option<f64> {
    let window = Duration::from_millis(10);
    let mut best: Option<f64> = None;
    let mut j = 0;
    for i in 0..marks.len() {
        j = j.max(i);
        while j < marks.len() && marks[j].0.duration_since(marks[i].0) < window {
            j += 1;
        }
        let Some(&(tj, nj)) = marks.get(j) else { break };
        let secs = tj.duration_since(marks[i].0).as_secs_f64();
        let bw = (nj - marks[i].1) as f64 * size as f64 / (1 << 20) as f64 / secs;
        best = Some(best.map_or(bw, |b: f64| b.max(bw)));
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peak_is_the_best_ten_millisecond_window() {
        let t = Instant::now();
        let ms = |m: u64| t + Duration::from_millis(m);
        // 100 messages of 1 MiB in the first 10 ms, then 10 in the next 10 ms.
        let marks = [(t, 0), (ms(10), 100), (ms(20), 110)];
        let p = peak(&marks, 1 << 20).unwrap();
        assert!((p - 10_000.0).abs() < 1.0, "{p}");
        assert_eq!(peak(&[(t, 0), (ms(5), 10)], 1), None);
    }
}
