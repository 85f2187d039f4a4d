//! Tensors from and to ndarray arrays: shapes and values survive, the
//! wrong element type is an error.

// A test crate: its helpers fail the test by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ndarray::{ArrayD, IxDyn};
use tessera_client::tensor::{from_array, to_array};
use tessera_client::ClientError;

#[test]
fn arrays_round_trip() {
    let a = ArrayD::from_shape_fn(IxDyn(&[2, 3, 4]), |i| {
        (i[0] * 100 + i[1] * 10 + i[2]) as f32
    });
    let t = from_array(&a).unwrap();
    assert_eq!(t.shape(), &[2, 3, 4]);
    assert_eq!(t.to_vec::<f32>().unwrap()[23], 123.0);
    let back: ArrayD<f32> = to_array(&t).unwrap();
    assert_eq!(back, a);

    let ids = ArrayD::from_shape_vec(IxDyn(&[3]), vec![7i64, -1, 42]).unwrap();
    assert_eq!(to_array::<i64>(&from_array(&ids).unwrap()).unwrap(), ids);
}

#[test]
fn the_wrong_element_type_is_an_error() {
    let a = ArrayD::<f32>::zeros(IxDyn(&[2]));
    let t = from_array(&a).unwrap();
    let err = to_array::<i64>(&t).unwrap_err();
    assert!(matches!(err, ClientError::Tensor(_)), "{err}");
}
