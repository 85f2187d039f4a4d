//! The state store on a real folder: epochs, ids, records, blobs, the
//! lock, and what a restart reads back.

use super::records::{ModelRecord, ModelRef, NetworkRecord, ReplicaRecord};
use super::store::{Store, StoreError};
use super::Keeper;
use tessera_common::wire::control::LoadRequest;

fn request(name: &str) -> LoadRequest {
    LoadRequest {
        name: name.into(),
        ..Default::default()
    }
}

fn network(id: u64, model: ModelRef) -> NetworkRecord {
    NetworkRecord {
        id,
        request: request(&format!("net-{id}")),
        tokenizer_json: None,
        model,
        types: Default::default(),
        considered: Vec::new(),
        replicas: vec![ReplicaRecord {
            index: 1,
            hosts: None,
            deployed: None,
            placement: [("conv".to_string(), "node-a/CPU".to_string())].into(),
        }],
        bones: None,
    }
}

fn blob(bytes: &[u8]) -> (String, ModelRef) {
    let sha256 = super::sha256_hex(bytes);
    (sha256.clone(), ModelRef::Blob { sha256 })
}

#[test]
fn every_start_is_a_new_epoch_and_ids_never_repeat() {
    let dir = tempfile::tempdir().unwrap();
    let first = Keeper::open(dir.path()).unwrap();
    assert_eq!(first.epoch(), 1);
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let ids: Vec<u64> = rt.block_on(async {
        let mut ids = Vec::new();
        for _ in 0..3 {
            ids.push(first.next_id().await);
        }
        ids
    });
    assert_eq!(ids, [1, 2, 3]);
    drop(first);
    let second = Keeper::open(dir.path()).unwrap();
    assert_eq!(second.epoch(), 2);
    let next = rt.block_on(second.next_id());
    assert!(next > 3, "an id of the last run again: {next}");
}

#[test]
fn a_second_coordinator_on_the_same_folder_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let _first = Store::open(dir.path()).unwrap();
    let err = match Store::open(dir.path()) {
        Err(e) => e,
        Ok(_) => panic!("two stores on one folder"),
    };
    assert!(matches!(err, StoreError::Db { .. }), "{err}");
    assert!(err.to_string().contains("state.redb"), "{err}");
}

#[test]
fn records_and_blobs_are_read_back_and_unnamed_blobs_collected() {
    let dir = tempfile::tempdir().unwrap();
    let (a_sha, a) = blob(b"model a");
    let (b_sha, b) = blob(b"model b");
    {
        let store = Store::open(dir.path()).unwrap();
        store.put_blob(&a_sha, b"model a").unwrap();
        store.put_blob(&b_sha, b"model b").unwrap();
        store.put_network(&network(7, a.clone())).unwrap();
        store.put_network(&network(9, b)).unwrap();
        let entry = ModelRecord {
            name: "cnn".into(),
            source: a,
            request: request("cnn"),
            tokenizer_json: None,
            wanted: true,
            network: Some(7),
        };
        store.put_models(&[entry]).unwrap();
        store.remove_network(9).unwrap();
        store.collect_blobs().unwrap();
    }
    let store = Store::open(dir.path()).unwrap();
    let networks = store.networks().unwrap();
    assert_eq!(networks.iter().map(|n| n.id).collect::<Vec<_>>(), [7]);
    assert_eq!(networks[0].replicas[0].placement["conv"], "node-a/CPU");
    let models = store.models().unwrap();
    assert_eq!(models.len(), 1);
    assert_eq!(models[0].network, Some(7));
    assert_eq!(&store.blob(&a_sha).unwrap()[..], b"model a");
    assert!(matches!(store.blob(&b_sha), Err(StoreError::NoBlob(_))));
}

#[test]
fn a_garbled_record_is_a_clear_error_and_bad_blob_names_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    assert!(matches!(
        store.put_blob("../../etc/passwd", b"x"),
        Err(StoreError::NoBlob(_))
    ));
    assert!(matches!(store.blob("not-hex"), Err(StoreError::NoBlob(_))));
    store.put_garbage_network(3).unwrap();
    let err = store.networks().unwrap_err();
    assert!(err.to_string().contains("network 3"), "{err}");
}

#[test]
fn a_networks_bones_are_kept_in_its_record_and_give_its_model_back() {
    use tessera_common::onnx::bones::Bones;
    let model = bytes::Bytes::from(tessera_common::onnx::encode_model(
        &tessera_common::synth::matmul_chain(2, 160, 5),
    ));
    let proto = tessera_common::onnx::decode_model_shared(model.clone()).unwrap();
    let bones = Bones::of(&model, &proto, |_| {});
    let dir = tempfile::tempdir().unwrap();
    let (_, a) = blob(&model);
    {
        let store = Store::open(dir.path()).unwrap();
        let mut record = network(4, a);
        record.bones = Some(super::records::KeptBones::of(&bones));
        store.put_network(&record).unwrap();
    }
    let store = Store::open(dir.path()).unwrap();
    let kept = store.networks().unwrap().remove(0).bones.unwrap();
    let back = kept.bones().unwrap();
    assert_eq!(back, bones);
    let weights = proto
        .graph
        .unwrap()
        .initializer
        .into_iter()
        .filter_map(|t| t.raw_data)
        .map(|b| (super::sha256_hex(&b), b))
        .collect();
    assert_eq!(back.model(&weights).unwrap(), model);
    // Garbled frames are refused, not put together.
    let garbled = super::records::KeptBones {
        frames: "not base64!".into(),
        ..kept.clone()
    };
    assert!(garbled.bones().is_err());
    let short = super::records::KeptBones {
        frames: String::new(),
        ..kept
    };
    assert!(short.bones().unwrap_err().contains("frames"));
}
