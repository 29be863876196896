//! `--role router`: an OpenAI front for several workers (stub; see
//! docs/disaggregation.md).

use crate::args::Args;

/// Serves the router until SIGINT / SIGTERM.
pub async fn serve(args: &Args) -> anyhow::Result<()> {
    anyhow::bail!("--role router is not built yet ({} decode peers given)", args.disagg.decode_peers.len())
}
