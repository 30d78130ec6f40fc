"""The line of a toolchain's message that says why survives into the one-line reason."""

from __future__ import annotations

from edgesdk.converters.toolchain_errors import native_cause, one_line

OPENVINO_RANK = (
    "Check 'false' failed at src/frontends/common_translators/src/unconverted_ops_report.cpp:151:\n"
    "FrontEnd API failed with OpConversionFailure:\n"
    "Model wasn't fully converted. Failed operations detailed log:\n"
    "-- Reshape-17 with a message:\n"
    "[ONNX Frontend] Conversion failed for Reshape-17\n"
    "While validating ONNX node '<Node(Reshape): /model/Reshape>': Exception from src/core/src/op/reshape.cpp:81:\n"
    "input data tensor's rank has to be known\n"
    "\n"
    "Summary:\n"
    "-- Conversion is failed for: Reshape-17\n"
)


def test_openvinos_cause_is_kept_and_its_framing_dropped() -> None:
    assert one_line(OPENVINO_RANK) == "Reshape-17 (node /model/Reshape): input data tensor's rank has to be known"


def test_no_conversion_rule_lines_and_plain_messages_pass_through() -> None:
    message = "Check 'false' failed at src/x.cpp:1:\nOpenVINO does not support the following ONNX operations: Foo\n"
    assert one_line(message) == "OpenVINO does not support the following ONNX operations: Foo"
    assert one_line("plain reason") == "plain reason"
    assert one_line("Check 'false' failed at src/x.cpp:1:") == "Check 'false' failed at src/x.cpp:1:"


def test_debug_writes_the_whole_message_to_stderr(monkeypatch, capsys) -> None:
    monkeypatch.setenv("EDGESDK_DEBUG", "1")
    assert "rank has to be known" in native_cause(OPENVINO_RANK, "OpenVINO")
    assert "unconverted_ops_report.cpp:151" in capsys.readouterr().err
    monkeypatch.delenv("EDGESDK_DEBUG")
    native_cause(OPENVINO_RANK, "OpenVINO")
    assert capsys.readouterr().err == ""


def test_our_words_before_a_cpp_location_stay() -> None:
    message = (
        "OpenVINO rejected the input: Exception from src/inference/src/cpp/infer_request.cpp:224:\n"
        "Check 'is_dynamic || port.get_shape() == tensor->get_shape()' failed at src/plugins/intel_cpu/src/infer_request.cpp:669:\n"
        "The input tensor size is not equal to the model input type: got [1] expecting [].\n"
    )
    assert one_line(message) == (
        "OpenVINO rejected the input; The input tensor size is not equal to the model input type: got [1] expecting []."
    )


#: LiteRT's reporter as it reached a user (issue 38): messages run together with no newline.
LITERT_GLUED = (
    "LiteRT could not load the model: failed to delegate MAX_POOL_2D node #29failed to delegate MAX_POOL_2D "
    "node #62failed to delegate MAX_POOL_2D node #97tflite/kernels/conv.cc:390 "
    "affine_quantization->zero_point->data[i] != 0 (2 != 0)Node number 0 (CONV_2D) failed to prepare."
)


def test_litert_messages_run_together_are_split_and_one_ops_delegation_misses_grouped() -> None:
    assert one_line(LITERT_GLUED) == (
        "LiteRT could not load the model: failed to delegate MAX_POOL_2D nodes #29, #62, #97; "
        "tflite/kernels/conv.cc:390 affine_quantization->zero_point->data[i] != 0 (2 != 0); "
        "Node number 0 (CONV_2D) failed to prepare."
    )
    assert one_line("failed to delegate ADD node #3") == "failed to delegate ADD node #3"
