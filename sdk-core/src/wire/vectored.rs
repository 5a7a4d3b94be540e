//! Received messages written to a socket as they are: one vectored write
//! for as many of them as the socket takes, no copy into one buffer. The
//! core's forwards and the supervisor's TCP relays both write this way.

use std::io::IoSlice;

use bytes::{Buf, Bytes};
use tokio::io::{AsyncWrite, AsyncWriteExt};

/// Writes every buffer, in order, with as few (vectored) writes as the
/// socket takes. Buffers are advanced past what was written, so on an
/// error `bufs` holds what is left.
pub async fn write_all_vectored<W: AsyncWrite + Unpin>(
    writer: &mut W,
    bufs: &mut [Bytes],
) -> std::io::Result<()> {
    let mut first = 0;
    while first < bufs.len() {
        if bufs[first].is_empty() {
            first += 1;
            continue;
        }
        let slices: Vec<IoSlice<'_>> = bufs[first..].iter().map(|b| IoSlice::new(b)).collect();
        let mut written = writer.write_vectored(&slices).await?;
        if written == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        while written > 0 {
            let len = bufs[first].len();
            if written >= len {
                written -= len;
                first += 1;
            } else {
                bufs[first].advance(written);
                written = 0;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn vectored_writes_deliver_every_buffer_in_order() {
        // A pipe smaller than the data forces partial vectored writes.
        let (mut writer, mut reader) = tokio::io::duplex(1000);
        let mut bufs: Vec<Bytes> = (0..20u8)
            .map(|i| Bytes::from(vec![i; 777]))
            .chain([Bytes::new()])
            .collect();
        let expected: Vec<u8> = bufs.iter().flat_map(|b| b.to_vec()).collect();
        let reading = tokio::spawn(async move {
            let mut got = Vec::new();
            reader.read_to_end(&mut got).await.unwrap();
            got
        });
        write_all_vectored(&mut writer, &mut bufs).await.unwrap();
        drop(writer);
        assert_eq!(reading.await.unwrap(), expected);
    }

    #[tokio::test]
    async fn a_closed_socket_is_an_error() {
        let (mut writer, reader) = tokio::io::duplex(16);
        drop(reader);
        let mut bufs = [Bytes::from_static(b"lost")];
        assert!(write_all_vectored(&mut writer, &mut bufs).await.is_err());
    }
}
