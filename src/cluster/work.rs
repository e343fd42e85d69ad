//! `submit_work`'s workflows, workers and scheduler. What they do and the invariants they
//! keep are in the docs of [`crate::cluster`].

use std::any::type_name;
use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::rc::Rc;
use std::time::{Duration, Instant};

use barewire_engine::sync::mpsc;
use barewire_engine::{spawn_local, time};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::resources::{Needs, Resources};
use super::start::{worker_name, Cluster};
use crate::actor::{catch, decode, encode, Actor, Context, ExitReason};
use crate::error::{Error, Result};

/// How long a worker that does not know a task yet (its node is still registering tasks) is
/// asked again before the task fails.
const REGISTER_GRACE: Duration = Duration::from_secs(10);

/// A task invocation's position in its workflow, and the type of its result.
///
/// ```
/// use barewire::cluster::{Task, Workflow};
/// let mut wf = Workflow::new();
/// let a = wf.add(Task::<u64>::new("load", &"part-0"));
/// let b = wf.add(Task::<String>::new("render", &()).after(a)); // takes a's result
/// assert_eq!((a.index(), b.index()), (0, 1));
/// ```
pub struct TaskId<R> {
    idx: usize,
    _r: PhantomData<fn() -> R>,
}

impl<R> Clone for TaskId<R> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<R> Copy for TaskId<R> {}

impl<R> TaskId<R> {
    /// Its index in the workflow (the order of [`Workflow::add`]).
    pub fn index(&self) -> usize {
        self.idx
    }
}

struct Spec {
    name: String,
    types: String,
    args: std::result::Result<Vec<u8>, String>,
    deps: Vec<usize>,
    needs: Needs,
    near: Option<usize>,
    idempotent: bool,
    timeout: Duration,
}

/// One invocation of a registered task, returning `R`: its arguments, what it depends on,
/// what it needs, where its data lives. Add it to a [`Workflow`].
///
/// ```
/// use barewire::cluster::{Needs, Task, Workflow};
/// use std::time::Duration;
/// let mut wf = Workflow::new();
/// let shard = wf.add(
///     Task::<Vec<u8>>::new("compress", &(3u32, "shard-3"))
///         .near(3) // its input lives on node 3
///         .idempotent() // safe to run again if that node dies
///         .timeout(Duration::from_secs(30)),
/// );
/// let upload = wf.add(
///     Task::<()>::new("upload", &())
///         .after(shard)
///         .needs(Needs::default().label("zone", "a")),
/// );
/// assert_eq!(upload.index(), 1);
/// ```
pub struct Task<R> {
    spec: Spec,
    _r: PhantomData<fn() -> R>,
}

fn types<A, R>() -> String {
    format!("{} -> {}", type_name::<A>(), type_name::<R>())
}

impl<R: DeserializeOwned> Task<R> {
    /// Task `name` with `args` (the task must take an `A` and return an `R`).
    pub fn new<A: Serialize>(name: &str, args: &A) -> Task<R> {
        Task {
            spec: Spec {
                name: name.into(),
                types: types::<A, R>(),
                args: encode(args).map_err(|e| e.to_string()),
                deps: Vec::new(),
                needs: Needs::default(),
                near: None,
                idempotent: false,
                timeout: Duration::from_secs(3600),
            },
            _r: PhantomData,
        }
    }

    /// Runs after `dep` succeeded; its result is the next of [`TaskContext::input`]'s inputs.
    pub fn after<D>(mut self, dep: TaskId<D>) -> Task<R> {
        self.spec.deps.push(dep.idx);
        self
    }

    /// Runs after each of `deps` succeeded; their results are the next inputs, in order.
    pub fn after_all<D>(mut self, deps: &[TaskId<D>]) -> Task<R> {
        self.spec.deps.extend(deps.iter().map(|d| d.idx));
        self
    }

    /// Runs only on a node that offers what `needs` asks.
    pub fn needs(mut self, needs: Needs) -> Task<R> {
        self.spec.needs = needs;
        self
    }

    /// Its data lives on node `rank` (a region's home, e.g. `SharedArray::home_of`): run it
    /// there, waiting for a free worker of that node; elsewhere only if that node is down or
    /// does not offer what the task needs.
    pub fn near(mut self, rank: usize) -> Task<R> {
        self.spec.near = Some(rank);
        self
    }

    /// Running it twice has the effect of running it once: if its node dies, run it again
    /// elsewhere.
    pub fn idempotent(mut self) -> Task<R> {
        self.spec.idempotent = true;
        self
    }

    /// Fails it ([`TaskError::TimedOut`]) when a run takes longer than `d` (default: an hour).
    pub fn timeout(mut self, d: Duration) -> Task<R> {
        self.spec.timeout = d;
        self
    }
}

/// A set of task invocations and their dependencies (each on tasks added before it, so there
/// are no cycles).
///
/// ```
/// use barewire::cluster::{Needs, Task, Workflow};
/// let mut wf = Workflow::new();
/// let parts: Vec<_> = (0..4u64)
///     .map(|i| wf.add(Task::<u64>::new("square", &i).idempotent()))
///     .collect();
/// let total = wf.add(Task::<u64>::new("sum", &()).after_all(&parts).needs(Needs::default().cores(1)));
/// assert_eq!((wf.len(), total.index()), (5, 4));
/// ```
#[derive(Default)]
pub struct Workflow {
    specs: Vec<Spec>,
}

impl Workflow {
    /// An empty workflow.
    pub fn new() -> Workflow {
        Workflow::default()
    }

    /// Adds `task`; the id to read its result with.
    pub fn add<R>(&mut self, task: Task<R>) -> TaskId<R> {
        self.specs.push(task.spec);
        TaskId {
            idx: self.specs.len() - 1,
            _r: PhantomData,
        }
    }

    /// Tasks in it.
    pub fn len(&self) -> usize {
        self.specs.len()
    }

    /// Whether it has no task.
    pub fn is_empty(&self) -> bool {
        self.specs.is_empty()
    }
}

/// Why a task has no result.
///
/// ```no_run
/// # async fn demo(cluster: barewire::cluster::Cluster) -> barewire::Result<()> {
/// use barewire::cluster::{Task, TaskError, Workflow};
/// let mut wf = Workflow::new();
/// let charge = wf.add(Task::<u64>::new("charge", &("card-1", 250u64))); // not idempotent
/// match cluster.submit_work(wf).await?.get(charge) {
///     Ok(id) => println!("charged: {id}"),
///     // Its node died mid-run: it may or may not have happened; look before retrying.
///     Err(TaskError::Lost { node }) => println!("check the ledger, node {node} went down"),
///     Err(e) => println!("failed: {e}"),
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TaskError {
    /// The task returned this error.
    #[error("the task failed: {0}")]
    Failed(String),
    /// The task panicked (its worker lives on).
    #[error("the task panicked: {0}")]
    Panicked(String),
    /// Its node went down while it ran and it is not idempotent: its effect may or may not
    /// have happened, so it was not run again.
    #[error("node {node} went down while running it, and it is not idempotent")]
    Lost {
        /// The node that went down.
        node: usize,
    },
    /// No member that is up offers what it needs.
    #[error("no member that is up can run it: {0}")]
    NoPlace(String),
    /// A task it depends on did not succeed (its index).
    #[error("task {0}, which it depends on, did not succeed")]
    Dependency(usize),
    /// A run took longer than its timeout.
    #[error("no result within {0:?}")]
    TimedOut(Duration),
    /// It cannot be run as described (unknown task, wrong types, undecodable arguments).
    #[error("{0}")]
    Invalid(String),
}

/// The results of a workflow, by task.
///
/// ```no_run
/// # async fn demo(cluster: barewire::cluster::Cluster) -> barewire::Result<()> {
/// use barewire::cluster::{Task, Workflow};
/// let mut wf = Workflow::new();
/// let ids: Vec<_> = (0..8u64).map(|i| wf.add(Task::<u64>::new("square", &i))).collect();
/// let results = cluster.submit_work(wf).await?;
/// for (i, e) in results.failures() {
///     eprintln!("task {i}: {e}");
/// }
/// let squares: Vec<u64> = ids.iter().filter_map(|id| results.get(*id).ok()).collect();
/// println!("{squares:?}, the first ran on node(s) {:?}", results.ran_on(ids[0]));
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct WorkResults {
    outcomes: Vec<std::result::Result<Vec<u8>, TaskError>>,
    ran_on: Vec<Vec<usize>>,
}

impl WorkResults {
    /// Task `id`'s result.
    pub fn get<R: DeserializeOwned>(&self, id: TaskId<R>) -> std::result::Result<R, TaskError> {
        match &self.outcomes[id.idx] {
            Ok(b) => decode(b).map_err(|e| TaskError::Invalid(e.to_string())),
            Err(e) => Err(e.clone()),
        }
    }

    /// The nodes task `id` was started on, in order (more than one when it was re-run).
    pub fn ran_on<R>(&self, id: TaskId<R>) -> &[usize] {
        &self.ran_on[id.idx]
    }

    /// The tasks that did not succeed, by index, with why.
    pub fn failures(&self) -> Vec<(usize, &TaskError)> {
        self.outcomes
            .iter()
            .enumerate()
            .filter_map(|(i, o)| o.as_ref().err().map(|e| (i, e)))
            .collect()
    }
}

/// What a running task knows: the results of what it depends on, and which attempt this is.
///
/// ```no_run
/// # fn demo(cluster: &barewire::cluster::Cluster) {
/// // A task that sums the results of the tasks it runs after.
/// cluster.register_task("sum", |_: (), ctx| async move {
///     let parts: Vec<u64> = ctx.inputs().map_err(|e| e.to_string())?;
///     if ctx.attempt() > 1 {
///         eprintln!("run again on node {} after a node died", ctx.rank());
///     }
///     Ok(parts.iter().sum::<u64>())
/// });
/// # }
/// ```
pub struct TaskContext {
    inputs: Vec<Vec<u8>>,
    attempt: u32,
    rank: usize,
}

impl TaskContext {
    /// The result of the `k`-th task it depends on (in [`Task::after`] order).
    pub fn input<T: DeserializeOwned>(&self, k: usize) -> Result<T> {
        let b = self.inputs.get(k).ok_or_else(|| {
            Error::Invalid(format!(
                "input {k} asked, the task depends on {}",
                self.inputs.len()
            ))
        })?;
        decode(b)
    }

    /// The results of everything it depends on, all of type `T`.
    pub fn inputs<T: DeserializeOwned>(&self) -> Result<Vec<T>> {
        self.inputs.iter().map(|b| decode(b)).collect()
    }

    /// 1 for the first run; more when its node died and it is run again.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// The node it runs on.
    pub fn rank(&self) -> usize {
        self.rank
    }
}

type TaskFuture = Pin<Box<dyn Future<Output = std::result::Result<Vec<u8>, RunFail>>>>;
type TaskFn = Rc<dyn Fn(&[u8], TaskContext) -> TaskFuture>;

/// The tasks this node can run, by name.
#[derive(Default)]
pub(super) struct Registry {
    tasks: RefCell<HashMap<String, (String, TaskFn)>>,
}

#[derive(Debug, Serialize, Deserialize)]
pub(super) enum RunFail {
    Failed(String),
    Panicked(String),
    /// Not registered here (yet).
    Unknown(String),
    Invalid(String),
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) enum WorkMsg {
    Offer,
    Run {
        name: String,
        types: String,
        args: Vec<u8>,
        inputs: Vec<Vec<u8>>,
        attempt: u32,
    },
}

#[derive(Debug, Serialize, Deserialize)]
pub(super) enum WorkReply {
    Offer(Resources),
    Ran(std::result::Result<Vec<u8>, RunFail>),
}

/// One of a node's workers: runs one task at a time.
pub(super) struct Worker {
    registry: Rc<Registry>,
    rank: usize,
    offer: Resources,
}

impl Worker {
    pub(super) fn new(registry: Rc<Registry>, rank: usize, offer: Resources) -> Worker {
        Worker {
            registry,
            rank,
            offer,
        }
    }
}

impl Actor for Worker {
    type Msg = WorkMsg;
    type Reply = WorkReply;

    async fn handle(&mut self, msg: WorkMsg, _: &Context<Self>) -> WorkReply {
        let (name, want, args, inputs, attempt) = match msg {
            WorkMsg::Offer => return WorkReply::Offer(self.offer.clone()),
            WorkMsg::Run {
                name,
                types,
                args,
                inputs,
                attempt,
            } => (name, types, args, inputs, attempt),
        };
        let found = self.registry.tasks.borrow().get(&name).cloned();
        let Some((have, f)) = found else {
            return WorkReply::Ran(Err(RunFail::Unknown(format!(
                "no task {name:?} registered on node {}",
                self.rank
            ))));
        };
        if have != want {
            return WorkReply::Ran(Err(RunFail::Invalid(format!(
                "task {name:?} on node {} is {have}, the workflow asked for {want}",
                self.rank
            ))));
        }
        let ctx = TaskContext {
            inputs,
            attempt,
            rank: self.rank,
        };
        WorkReply::Ran(match catch(f(&args, ctx)).await {
            Ok(r) => r,
            Err(ExitReason::Panic(m)) => Err(RunFail::Panicked(m)),
            Err(other) => Err(RunFail::Panicked(other.to_string())),
        })
    }
}

/// Ready tasks, queued by kind (the same locality, needs and nodes to avoid: the same
/// placement), in the order they became ready; a pass over them stops each queue at its first
/// task that has to wait, so a long backlog costs nothing per completion.
#[derive(Default)]
struct Ready {
    queues: Vec<VecDeque<usize>>,
}

impl Ready {
    fn push(&mut self, t: usize, same: impl Fn(usize, usize) -> bool) {
        match self
            .queues
            .iter_mut()
            .find(|q| q.front().is_some_and(|&f| same(f, t)))
        {
            Some(q) => q.push_back(t),
            None => self.queues.push(VecDeque::from([t])),
        }
    }
}

enum Answer {
    Done(Vec<u8>),
    Error(TaskError),
    /// Its node went down (or the connection to it failed) before it answered.
    NodeLost,
}

enum Place {
    Now(usize, usize),
    Later,
    Never(String),
}

impl Cluster {
    /// Registers task `name` on this node: `f` takes the arguments and a [`TaskContext`] and
    /// returns the result or an error message. Every node that may run it registers it; a
    /// workflow naming a task this node lacks fails at once, and a node that has not
    /// registered it yet is asked again for a few seconds (its program may still be starting).
    ///
    /// ```no_run
    /// # fn demo(cluster: &barewire::cluster::Cluster) {
    /// cluster.register_task("sum", |(): (), ctx| async move {
    ///     let parts: Vec<u64> = ctx.inputs().map_err(|e| e.to_string())?;
    ///     Ok(parts.iter().sum::<u64>())
    /// });
    /// # }
    /// ```
    pub fn register_task<A, R, F, Fut>(&self, name: &str, f: F)
    where
        A: DeserializeOwned + 'static,
        R: Serialize + 'static,
        F: Fn(A, TaskContext) -> Fut + 'static,
        Fut: Future<Output = std::result::Result<R, String>> + 'static,
    {
        let f = Rc::new(f);
        let run: TaskFn = Rc::new(move |args: &[u8], ctx: TaskContext| -> TaskFuture {
            let f = f.clone();
            let args = decode::<A>(args);
            Box::pin(async move {
                let args = args.map_err(|e| RunFail::Invalid(format!("arguments: {e}")))?;
                let r = f(args, ctx).await.map_err(RunFail::Failed)?;
                encode(&r).map_err(|e| RunFail::Invalid(format!("result: {e}")))
            })
        });
        self.registry
            .tasks
            .borrow_mut()
            .insert(name.to_string(), (types::<A, R>(), run));
    }

    /// Runs `wf` on the cluster and collects every task's result (see the module's invariants
    /// for what happens when a node dies). Fails only when the workflow itself is malformed:
    /// a task this node does not know, or of other types, or whose arguments did not encode.
    pub async fn submit_work(&self, wf: Workflow) -> Result<WorkResults> {
        let specs = wf.specs;
        for (i, s) in specs.iter().enumerate() {
            if let Err(e) = &s.args {
                return Err(Error::Invalid(format!(
                    "task {i} ({}): arguments: {e}",
                    s.name
                )));
            }
            match self.registry.tasks.borrow().get(&s.name) {
                None => {
                    return Err(Error::Invalid(format!(
                        "task {i}: no task {:?} is registered on this node",
                        s.name
                    )))
                }
                Some((have, _)) if *have != s.types => {
                    return Err(Error::Invalid(format!(
                        "task {i} ({}): registered as {have}, the workflow asks for {}",
                        s.name, s.types
                    )))
                }
                Some(_) => {}
            }
            if let Some(d) = s.deps.iter().find(|d| **d >= i) {
                return Err(Error::Invalid(format!(
                    "task {i} depends on task {d}, which is not added before it"
                )));
            }
        }
        let n = specs.len();
        let mut waiting: Vec<usize> = specs.iter().map(|s| s.deps.len()).collect();
        let mut dependents = vec![Vec::new(); n];
        for (i, s) in specs.iter().enumerate() {
            for &d in &s.deps {
                dependents[d].push(i);
            }
        }
        let mut outcomes: Vec<Option<std::result::Result<Vec<u8>, TaskError>>> = vec![None; n];
        let mut ran_on = vec![Vec::new(); n];
        let mut attempt = vec![0u32; n];
        let mut shunned: Vec<Vec<usize>> = vec![Vec::new(); n];
        let mut busy: Vec<Vec<bool>> = self.offers.iter().map(|o| vec![false; o.cores]).collect();
        let same = |a: usize, b: usize, shunned: &[Vec<usize>]| {
            specs[a].near == specs[b].near
                && specs[a].needs == specs[b].needs
                && shunned[a] == shunned[b]
        };
        let mut ready = Ready::default();
        for t in (0..n).filter(|i| waiting[*i] == 0) {
            ready.push(t, |a, b| same(a, b, &shunned));
        }
        let mut left = n;
        let (tx, mut rx) = mpsc::unbounded::<(usize, u32, usize, usize, Answer)>();
        let mut running = 0usize;
        while left > 0 {
            for q in &mut ready.queues {
                // The first of a kind that must wait stops its queue for this pass: the others
                // of its kind would wait too.
                while let Some(&t) = q.front() {
                    match self.place(&specs[t], &busy, &shunned[t]) {
                        Place::Now(node, slot) => {
                            q.pop_front();
                            busy[node][slot] = true;
                            attempt[t] += 1;
                            ran_on[t].push(node);
                            running += 1;
                            let inputs = specs[t]
                                .deps
                                .iter()
                                .map(|d| match &outcomes[*d] {
                                    Some(Ok(b)) => b.clone(),
                                    _ => unreachable!("a task is ready only once its inputs are"),
                                })
                                .collect();
                            let msg = WorkMsg::Run {
                                name: specs[t].name.clone(),
                                types: specs[t].types.clone(),
                                args: specs[t].args.clone().unwrap_or_default(),
                                inputs,
                                attempt: attempt[t],
                            };
                            let run = self.run_on(node, slot, msg, specs[t].timeout);
                            let tx = tx.clone();
                            let a = attempt[t];
                            // (Dropping the handle leaves the task running.)
                            drop(spawn_local(async move {
                                let answer = run.await;
                                let _ = tx.try_send((t, a, node, slot, answer));
                            }));
                        }
                        Place::Later => break,
                        Place::Never(why) => {
                            q.pop_front();
                            left -= fail(&mut outcomes, &dependents, t, TaskError::NoPlace(why));
                        }
                    }
                }
            }
            ready.queues.retain(|q| !q.is_empty());
            if left == 0 {
                break;
            }
            // With nothing running, a task waits only if `place` is wrong: say so, never hang.
            let got = if running == 0 { None } else { rx.recv().await };
            let Some((t, a, node, slot, answer)) = got else {
                return Err(Error::Invalid(format!(
                    "submit_work: {left} tasks can neither run nor fail (a scheduler bug)"
                )));
            };
            running -= 1;
            busy[node][slot] = false;
            if a != attempt[t] || outcomes[t].is_some() {
                continue;
            }
            match answer {
                Answer::Done(b) => {
                    outcomes[t] = Some(Ok(b));
                    left -= 1;
                    for &d in &dependents[t] {
                        waiting[d] -= 1;
                        if waiting[d] == 0 && outcomes[d].is_none() {
                            ready.push(d, |a, b| same(a, b, &shunned));
                        }
                    }
                }
                Answer::Error(e) => left -= fail(&mut outcomes, &dependents, t, e),
                Answer::NodeLost if specs[t].idempotent => {
                    shunned[t].push(node);
                    ready.push(t, |a, b| same(a, b, &shunned));
                }
                Answer::NodeLost => {
                    left -= fail(&mut outcomes, &dependents, t, TaskError::Lost { node })
                }
            }
        }
        Ok(WorkResults {
            outcomes: outcomes
                .into_iter()
                .map(|o| o.expect("every task ended"))
                .collect(),
            ran_on,
        })
    }

    /// Where task `s` goes: the node near its data if that one is up and fits (once it has a
    /// free worker), otherwise the fitting node with the most free workers (ties: round robin).
    fn place(&self, s: &Spec, busy: &[Vec<bool>], shunned: &[usize]) -> Place {
        let mut fits = Vec::new();
        let mut why = Vec::new();
        for (r, offer) in self.offers.iter().enumerate() {
            if shunned.contains(&r) {
                why.push(format!("node {r}: it went down while running this task"));
            } else if !self.is_up(r) {
                why.push(format!("node {r}: down"));
            } else if let Some(lack) = s.needs.unmet_by(offer) {
                why.push(format!("node {r}: {lack}"));
            } else {
                fits.push(r);
            }
        }
        if fits.is_empty() {
            return Place::Never(why.join("; "));
        }
        let free = |r: usize| busy[r].iter().position(|b| !b);
        if let Some(near) = s.near.filter(|r| fits.contains(r)) {
            return match free(near) {
                Some(slot) => Place::Now(near, slot),
                None => Place::Later,
            };
        }
        let n = self.offers.len();
        let start = self.cursor.get();
        let best = (0..n)
            .map(|k| (start + k) % n)
            .filter(|r| fits.contains(r))
            .max_by_key(|r| {
                (
                    busy[*r].iter().filter(|b| !**b).count(),
                    n - (r + n - start) % n,
                )
            });
        match best.and_then(|r| free(r).map(|slot| (r, slot))) {
            Some((r, slot)) => {
                self.cursor.set((r + 1) % n);
                Place::Now(r, slot)
            }
            None => Place::Later,
        }
    }

    /// Runs `msg` on worker `slot` of `node`; what came of it.
    fn run_on(
        &self,
        node: usize,
        slot: usize,
        msg: WorkMsg,
        timeout: Duration,
    ) -> impl Future<Output = Answer> + 'static {
        let cached = self.workers.borrow().get(&(node, slot)).cloned();
        let system = self.system.clone();
        let workers = Rc::downgrade(&self.workers);
        async move {
            let w = match cached {
                Some(w) => w,
                None => match system.lookup::<Worker>(node, &worker_name(slot)).await {
                    Ok(w) => {
                        if let Some(c) = workers.upgrade() {
                            c.borrow_mut().insert((node, slot), w.clone());
                        }
                        w
                    }
                    Err(Error::PeerGone(_)) => return Answer::NodeLost,
                    Err(e) => {
                        return Answer::Error(TaskError::Invalid(format!(
                            "node {node} has no worker {slot}: {e}"
                        )))
                    }
                },
            };
            let t0 = Instant::now();
            loop {
                let left = timeout.saturating_sub(t0.elapsed());
                let r = w.ask(msg.clone(), left).await;
                return match r {
                    Ok(WorkReply::Ran(Ok(b))) => Answer::Done(b),
                    Ok(WorkReply::Ran(Err(RunFail::Unknown(e)))) => {
                        if t0.elapsed() < REGISTER_GRACE {
                            time::sleep(Duration::from_millis(10)).await;
                            continue;
                        }
                        Answer::Error(TaskError::Invalid(e))
                    }
                    Ok(WorkReply::Ran(Err(RunFail::Failed(e)))) => {
                        Answer::Error(TaskError::Failed(e))
                    }
                    Ok(WorkReply::Ran(Err(RunFail::Panicked(e)))) => {
                        Answer::Error(TaskError::Panicked(e))
                    }
                    Ok(WorkReply::Ran(Err(RunFail::Invalid(e)))) => {
                        Answer::Error(TaskError::Invalid(e))
                    }
                    Ok(WorkReply::Offer(_)) => Answer::Error(TaskError::Invalid(format!(
                        "node {node} answered a run with an offer"
                    ))),
                    Err(Error::Timeout(_)) => Answer::Error(TaskError::TimedOut(timeout)),
                    Err(Error::PeerGone(_) | Error::Exited(_) | Error::Closed) => Answer::NodeLost,
                    Err(e) => Answer::Error(TaskError::Invalid(format!("node {node}: {e}"))),
                };
            }
        }
    }
}

/// Ends task `t` with `e`, and every task waiting on it (transitively) with `Dependency`;
/// how many tasks ended.
fn fail(
    outcomes: &mut [Option<std::result::Result<Vec<u8>, TaskError>>],
    dependents: &[Vec<usize>],
    t: usize,
    e: TaskError,
) -> usize {
    if outcomes[t].is_some() {
        return 0;
    }
    outcomes[t] = Some(Err(e));
    let mut ended = 1;
    for &d in &dependents[t] {
        ended += fail(outcomes, dependents, d, TaskError::Dependency(t));
    }
    ended
}
