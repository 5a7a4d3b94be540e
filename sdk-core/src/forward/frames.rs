//! A forward connection's frames: socket reads that are gRPC messages
//! already (headers written into room in front of the data) and the read
//! blocks they are cut from. Received frames go to the socket through
//! [`crate::wire::write_all_vectored`].

use bytes::{BufMut, Bytes, BytesMut};
use tokio::io::AsyncReadExt;

use super::MAX_FRAME;
use crate::wire::{PREFIX_LEN, write_prefix};

/// Room in front of a read for the gRPC prefix (5 bytes), the `data`
/// field's tag (1 byte) and its length (a varint: 3 bytes up to 2 MiB).
const HEADER_ROOM: usize = PREFIX_LEN + 4;
/// Reads are split off blocks of this size; a block is used again once the
/// frames cut from it are sent ([`ReadBlocks`]), so reads do not allocate
/// (and fault in) fresh memory each time.
const READ_BLOCK: usize = 4 * (HEADER_ROOM + MAX_FRAME);
/// Blocks a connection keeps while their frames are still on the way out,
/// beside the one it reads into.
const SPARE_BLOCKS: usize = 16;
/// A read shorter than this means the local side is not streaming: the
/// spare blocks go back to the allocator.
const QUIET_READ: usize = MAX_FRAME / 4;

/// A connection's read buffers. Frames cut from a block stay alive until
/// HTTP/2 has written them, so a spent block cannot be reused at once; it
/// waits among the spares until every frame of it is gone, then serves
/// again. Without this, each block was freed while the next was
/// allocated, and glibc handed the pages back to the kernel in between:
/// every read faulted fresh pages in.
#[derive(Default)]
pub(super) struct ReadBlocks {
    /// The rest of the block being read into (empty before the first read).
    current: BytesMut,
    /// Whether `current` is part of a block (its capacity may be used up).
    in_block: bool,
    spares: Vec<BytesMut>,
}

impl ReadBlocks {
    /// Makes room for one frame in `current`.
    fn make_room(&mut self) {
        if self.current.capacity() >= HEADER_ROOM + MAX_FRAME {
            return;
        }
        let spent = std::mem::take(&mut self.current);
        if self.in_block {
            // Even with no capacity left it holds its block.
            self.spares.push(spent);
        }
        self.in_block = true;
        if let Some(i) = self
            .spares
            .iter_mut()
            .position(|b| b.try_reclaim(READ_BLOCK))
        {
            self.current = self.spares.swap_remove(i);
            return;
        }
        if self.spares.len() > SPARE_BLOCKS {
            // Still in flight: let the oldest go when its frames are sent.
            self.spares.remove(0);
        }
        self.current = BytesMut::with_capacity(READ_BLOCK);
    }

    /// After a read of `n` bytes: a quiet connection keeps one block only.
    fn after_read(&mut self, n: usize) {
        if n < QUIET_READ {
            self.spares.clear();
        }
    }
}

/// `TcpForwardFrame{data}` tag: field 2, length-delimited.
const DATA_TAG: u8 = 2 << 3 | 2;

/// Reads at most `MAX_FRAME` bytes from `reader` into a fresh frame buffer
/// and returns them as a gRPC message (prefix included) holding a
/// `TcpForwardFrame{data}`, without copying the payload: the headers go
/// into the room left in front of it. `None` at EOF.
pub(super) async fn read_data_frame<R: tokio::io::AsyncRead + Unpin>(
    reader: &mut R,
    blocks: &mut ReadBlocks,
) -> std::io::Result<Option<(Bytes, usize)>> {
    blocks.current.clear();
    blocks.make_room();
    let buf = &mut blocks.current;
    buf.put_bytes(0, HEADER_ROOM);
    let n = reader.read_buf(&mut (&mut *buf).limit(MAX_FRAME)).await?;
    if n == 0 {
        return Ok(None);
    }
    let header = data_header(n);
    let message = HEADER_ROOM - header.len();
    buf[message..HEADER_ROOM].copy_from_slice(&header);
    let start = message - PREFIX_LEN;
    write_prefix(&mut buf[start..message], header.len() + n);
    let frame = buf.split().freeze().slice(start..);
    blocks.after_read(n);
    Ok(Some((frame, n)))
}

/// The tag and length varint of a `data` field of `len` bytes.
fn data_header(len: usize) -> Vec<u8> {
    let mut header = Vec::with_capacity(HEADER_ROOM - PREFIX_LEN);
    header.push(DATA_TAG);
    prost::encoding::encode_varint(len as u64, &mut header);
    debug_assert!(header.len() <= HEADER_ROOM - PREFIX_LEN);
    header
}

/// The message of one gRPC-framed frame, after checking its prefix.
#[cfg(test)]
pub(super) fn unframe(frame: Bytes) -> Bytes {
    assert_eq!(frame[0], 0, "compressed flag");
    let len = u32::from_be_bytes(frame[1..PREFIX_LEN].try_into().unwrap()) as usize;
    assert_eq!(len, frame.len() - PREFIX_LEN, "prefix length");
    frame.slice(PREFIX_LEN..)
}

#[cfg(test)]
mod tests {
    use super::*;
    use openshell_proto as pb;
    use openshell_proto::tcp_forward_frame::Payload as FramePayload;
    use prost::Message;

    /// `data` encoded the way the pump does it: through a read (the gRPC
    /// prefix checked and taken off).
    fn encoded_data(payload: &[u8]) -> Bytes {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let mut reader = payload;
        let mut blocks = ReadBlocks::default();
        let (frame, n) = rt
            .block_on(read_data_frame(&mut reader, &mut blocks))
            .unwrap()
            .unwrap();
        assert_eq!(n, payload.len());
        unframe(frame)
    }

    #[test]
    fn frames_built_in_place_decode_as_prost_encodes_them() {
        // Every varint length size, and the largest frame.
        for len in [1, 127, 128, 16_383, 16_384, MAX_FRAME] {
            let payload: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let frame = encoded_data(&payload);
            let expected = pb::TcpForwardFrame {
                payload: Some(FramePayload::Data(Bytes::from(payload.clone()))),
            }
            .encode_to_vec();
            assert_eq!(frame, expected, "len {len}");
        }
    }

    #[tokio::test]
    async fn a_read_never_makes_a_frame_larger_than_max_frame() {
        let payload = vec![3u8; 3 * MAX_FRAME + 10];
        let mut reader = &payload[..];
        let mut blocks = ReadBlocks::default();
        let mut total = 0;
        while let Some((frame, n)) = read_data_frame(&mut reader, &mut blocks).await.unwrap() {
            assert!(n <= MAX_FRAME);
            let decoded = pb::TcpForwardFrame::decode(unframe(frame)).unwrap();
            let Some(FramePayload::Data(data)) = decoded.payload else {
                panic!("not data")
            };
            assert_eq!(data.len(), n);
            total += n;
        }
        assert_eq!(total, payload.len());
    }

    #[tokio::test]
    async fn a_block_serves_again_once_its_frames_are_gone_and_quiet_reads_drop_spares() {
        let payload = vec![1u8; 64 * MAX_FRAME];
        let mut reader = &payload[..];
        let mut blocks = ReadBlocks::default();
        // Frames dropped at once (sent): one block keeps serving, so the
        // frames land at its four places over and over.
        let mut places = std::collections::HashSet::new();
        for _ in 0..32 {
            let (frame, _) = read_data_frame(&mut reader, &mut blocks)
                .await
                .unwrap()
                .unwrap();
            places.insert(frame.as_ptr() as usize);
        }
        assert_eq!(
            places.len(),
            4,
            "frames of 32 reads at {} places",
            places.len()
        );
        assert!(blocks.spares.is_empty());
        // Frames held (in flight): spares are kept, at most SPARE_BLOCKS + 1.
        let mut held = Vec::new();
        for _ in 0..24 {
            held.push(
                read_data_frame(&mut reader, &mut blocks)
                    .await
                    .unwrap()
                    .unwrap(),
            );
        }
        assert!(blocks.spares.len() <= SPARE_BLOCKS + 1);
        assert!(!blocks.spares.is_empty());
        // A short read: only the current block stays.
        let mut short = &b"tiny"[..];
        read_data_frame(&mut short, &mut blocks)
            .await
            .unwrap()
            .unwrap();
        assert!(blocks.spares.is_empty());
        drop(held);
    }

    #[test]
    fn a_read_encodes_data_frames() {
        let data = pb::TcpForwardFrame::decode(encoded_data(b"abc")).unwrap();
        assert_eq!(
            data.payload,
            Some(FramePayload::Data(Bytes::from_static(b"abc")))
        );
    }
}
