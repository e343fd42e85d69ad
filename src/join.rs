//! Running several futures of this core side by side, stopping at the first error.

use std::future::{poll_fn, Future};
use std::task::Poll;

use crate::error::Result;

/// Runs every future to completion side by side and returns their outputs in order, or the
/// first error as soon as one fails (the others are dropped, which cancels them).
pub(crate) async fn try_join_all<T, F: Future<Output = Result<T>>>(futs: Vec<F>) -> Result<Vec<T>> {
    let mut futs: Vec<_> = futs.into_iter().map(Box::pin).collect();
    let mut out: Vec<Option<T>> = futs.iter().map(|_| None).collect();
    poll_fn(|cx| {
        let mut done = true;
        for (f, o) in futs.iter_mut().zip(out.iter_mut()) {
            if o.is_none() {
                match f.as_mut().poll(cx) {
                    Poll::Ready(Ok(v)) => *o = Some(v),
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Pending => done = false,
                }
            }
        }
        if done {
            Poll::Ready(Ok(()))
        } else {
            Poll::Pending
        }
    })
    .await?;
    Ok(out
        .into_iter()
        .map(|o| o.expect("every future finished"))
        .collect())
}

/// Two futures of different types side by side, stopping at the first error.
pub(crate) async fn try_join2<A, B>(
    a: impl Future<Output = Result<A>>,
    b: impl Future<Output = Result<B>>,
) -> Result<(A, B)> {
    let mut a = std::pin::pin!(a);
    let mut b = std::pin::pin!(b);
    let mut ra = None;
    let mut rb = None;
    poll_fn(|cx| {
        if ra.is_none() {
            if let Poll::Ready(v) = a.as_mut().poll(cx) {
                ra = Some(v?);
            }
        }
        if rb.is_none() {
            if let Poll::Ready(v) = b.as_mut().poll(cx) {
                rb = Some(v?);
            }
        }
        if ra.is_some() && rb.is_some() {
            Poll::Ready(Ok((ra.take().unwrap(), rb.take().unwrap())))
        } else {
            Poll::Pending
        }
    })
    .await
}
