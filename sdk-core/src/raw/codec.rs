//! A tonic codec that passes encoded messages through untouched.

use bytes::{Buf, BufMut, Bytes};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};

/// A tonic codec that passes encoded messages through as [`Bytes`], so one
/// client can call any method of any proto.
#[derive(Debug, Clone, Copy, Default)]
pub struct BytesCodec;

/// Encoder half of [`BytesCodec`].
#[derive(Debug, Clone, Copy, Default)]
pub struct BytesEncoder;

/// Decoder half of [`BytesCodec`].
#[derive(Debug, Clone, Copy, Default)]
pub struct BytesDecoder;

impl Codec for BytesCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = BytesEncoder;
    type Decoder = BytesDecoder;

    fn encoder(&mut self) -> Self::Encoder {
        BytesEncoder
    }

    fn decoder(&mut self) -> Self::Decoder {
        BytesDecoder
    }
}

impl Encoder for BytesEncoder {
    type Item = Bytes;
    type Error = tonic::Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Self::Error> {
        dst.reserve(item.len());
        dst.put(item);
        Ok(())
    }
}

impl Decoder for BytesDecoder {
    type Item = Bytes;
    type Error = tonic::Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Self::Error> {
        // `src` holds exactly one message; gRPC framing is handled by tonic.
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use tonic::codec::{EncodeBody, Streaming};

    #[tokio::test]
    async fn bytes_codec_round_trips_through_grpc_framing() {
        let messages = vec![
            Bytes::from_static(b""),
            Bytes::from_static(b"\x0a\x03abc"),
            Bytes::from(vec![7u8; 100_000]),
        ];
        let source = futures::stream::iter(messages.clone().into_iter().map(Ok));
        let body = EncodeBody::new_client(BytesEncoder, source, None, None);
        let framed = body.collect().await.unwrap().to_bytes();
        // Each message is framed as: flag (0), length (u32 BE), payload.
        assert_eq!(
            framed.len(),
            messages.iter().map(|m| 5 + m.len()).sum::<usize>()
        );
        assert_eq!(&framed[..5], &[0, 0, 0, 0, 0]);
        assert_eq!(&framed[5..10], &[0, 0, 0, 0, 5]);

        let body = http_body_util::Full::new(framed);
        let mut decoded = Streaming::new_request(BytesDecoder, body, None, None);
        let mut out = Vec::new();
        while let Some(m) = decoded.message().await.unwrap() {
            out.push(m);
        }
        assert_eq!(out, messages);
    }
}
