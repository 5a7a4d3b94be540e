//! The gRPC listener of a cluster member, and what being fenced does to it.
//!
//! A replica whose membership could not be refreshed for longer than the
//! TTL (it lost its store: a cut link, a hung database) is fenced by
//! `cluster`: the other replicas have dropped it from their rings by then
//! and place its sandboxes elsewhere, so it must stop acting as an owner.
//! Fenced, it
//! - stops the current server generation: the listening socket closes (a
//!   connect is refused, which every edge treats as "not forwarded", so a
//!   hinted call is retried unrouted and an unhinted one goes to another
//!   replica) and every open connection gets HTTP/2 GOAWAY, so no new call
//!   starts here while streams already running (an exec, a forward) finish;
//! - hands every session off: supervisors that follow redirects are sent
//!   to their owner on the last ring it had, others and supervisor hosts
//!   reconnect through the address they were given (the edge);
//! - answers `/readyz` with 503.
//!
//! When a refresh succeeds again, a new generation listens on the same
//! address, the replica is a member again and the idle rebalancer sends
//! its sandboxes' sessions home.

use std::future::Future;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// How long a fenced replica waits between attempts to listen again when
/// its address is taken.
const REBIND_RETRY: std::time::Duration = std::time::Duration::from_secs(1);

/// Serves generations of `serve_one` (one server on one listener, ended
/// gracefully by its token) until `stop`: one for as long as `fenced` stays
/// false, none while it is true. Returns once every generation has ended.
pub async fn serve<F, Fut>(
    serve_one: F,
    mut listener: TcpListener,
    mut fenced: Option<watch::Receiver<bool>>,
    on_fence: impl Fn(),
    stop: CancellationToken,
) where
    F: Fn(TcpListener, CancellationToken) -> Fut,
    Fut: Future<Output = Result<(), tonic::transport::Error>> + Send + 'static,
{
    let addr = listener.local_addr().ok();
    let mut generations = Vec::new();
    loop {
        let generation = stop.child_token();
        let server = serve_one(listener, generation.clone());
        generations.push(tokio::spawn(async move {
            if let Err(err) = server.await {
                tracing::warn!(%err, "server ended with an error");
            }
        }));
        if !changed_to(&mut fenced, true, &stop).await {
            break;
        }
        tracing::warn!("fenced: no longer listening; handing sessions off");
        generation.cancel();
        on_fence();
        if !changed_to(&mut fenced, false, &stop).await {
            break;
        }
        let Some(addr) = addr else { break };
        listener = loop {
            match TcpListener::bind(addr).await {
                Ok(listener) => break listener,
                Err(err) => {
                    tracing::warn!(%err, %addr, "listening again after the fence");
                    tokio::select! {
                        _ = stop.cancelled() => return join(generations).await,
                        _ = tokio::time::sleep(REBIND_RETRY) => {}
                    }
                }
            }
        };
        tracing::info!(%addr, "membership is back: listening again");
        generations.retain(|g| !g.is_finished());
    }
    join(generations).await
}

/// Waits until `fenced` reads `value` (false: until `stop`, when there is
/// no fence to follow). Returns false when `stop` fired first.
async fn changed_to(
    fenced: &mut Option<watch::Receiver<bool>>,
    value: bool,
    stop: &CancellationToken,
) -> bool {
    let Some(rx) = fenced else {
        stop.cancelled().await;
        return false;
    };
    tokio::select! {
        _ = stop.cancelled() => false,
        gone = async { rx.wait_for(|fenced| *fenced == value).await.is_err() } => {
            if gone {
                stop.cancelled().await;
                return false;
            }
            true
        }
    }
}

async fn join(generations: Vec<tokio::task::JoinHandle<()>>) {
    for generation in generations {
        let _ = generation.await;
    }
}
