//! Calls with encoded messages in and out, so a test can send what no
//! generated client would.

use openshell_testkit::Gateway;

use super::TOKEN;

#[derive(Clone, Default)]
pub struct RawCodec;

impl tonic::codec::Codec for RawCodec {
    type Encode = bytes::Bytes;
    type Decode = bytes::Bytes;
    type Encoder = RawCodec;
    type Decoder = RawCodec;
    fn encoder(&mut self) -> Self::Encoder {
        RawCodec
    }
    fn decoder(&mut self) -> Self::Decoder {
        RawCodec
    }
}

impl tonic::codec::Encoder for RawCodec {
    type Item = bytes::Bytes;
    type Error = tonic::Status;
    fn encode(
        &mut self,
        item: bytes::Bytes,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        bytes::BufMut::put(dst, item);
        Ok(())
    }
}

impl tonic::codec::Decoder for RawCodec {
    type Item = bytes::Bytes;
    type Error = tonic::Status;
    fn decode(
        &mut self,
        src: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<bytes::Bytes>, tonic::Status> {
        let len = bytes::Buf::remaining(src);
        Ok(Some(bytes::Buf::copy_to_bytes(src, len)))
    }
}

/// Sends `messages` on the streaming method `path` with `headers` (and the
/// test token); the status the stream ends with (OK "ended" for a clean
/// end), the messages it answered skipped.
pub async fn raw_stream(
    gw: &Gateway,
    path: &'static str,
    messages: Vec<bytes::Bytes>,
    headers: &[(&'static str, &'static str)],
) -> tonic::Status {
    let channel = tonic::transport::Channel::from_shared(gw.url.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let mut request = tonic::Request::new(tokio_stream::iter(messages));
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
    for (name, value) in headers {
        request.metadata_mut().insert(*name, value.parse().unwrap());
    }
    let path = http::uri::PathAndQuery::from_static(path);
    let mut stream = match grpc.streaming(request, path, RawCodec).await {
        Ok(response) => response.into_inner(),
        Err(status) => return status,
    };
    loop {
        match tokio::time::timeout(std::time::Duration::from_secs(20), stream.message()).await {
            Ok(Ok(Some(_))) => continue,
            Ok(Ok(None)) => return tonic::Status::ok("ended"),
            Ok(Err(status)) => return status,
            Err(_) => panic!("the stream neither failed nor ended"),
        }
    }
}
