#include "trainer/model/parameter_table.h"

#include "gtest/gtest.h"

namespace mptrain {
namespace {

ParameterTable SmallTable() {
  ParameterTable table;
  table.Add("wte", {5, 2});
  table.EndGroup();
  table.Add("ln.weight", {2}, /*weight_decay=*/false, 1.0f);
  table.Add("ln.bias", {2}, /*weight_decay=*/false, 0.0f);
  table.EndGroup();
  table.AddBuffer("bn.running_var", {2}, /*variance=*/true);
  table.AddCounter("bn.num_batches_tracked");
  return table;
}

TEST(ParameterTable, ParametersFollowEachOther_AndGroupsAreTheirSpans) {
  ParameterTable table = SmallTable();
  ASSERT_EQ(table.parameters().size(), 3u);
  EXPECT_EQ(table.parameters()[0].offset, 0);
  EXPECT_EQ(table.parameters()[1].offset, 10);
  EXPECT_EQ(table.parameters()[2].offset, 12);
  EXPECT_EQ(table.total(), 14);
  ASSERT_EQ(table.groups().size(), 2u);
  EXPECT_EQ(table.groups()[0].end, 10);
  EXPECT_EQ(table.groups()[1].begin, 10);
  EXPECT_EQ(table.groups()[1].end, 14);
  table.EndGroup();
  EXPECT_EQ(table.groups().size(), 2u) << "an empty group is not made";
  EXPECT_EQ(table.Find("ln.bias")->offset, 12);
  EXPECT_EQ(table.Find("nope"), nullptr);
  EXPECT_EQ(table.Names({"exp_avg"}).count("exp_avg.ln.weight"), 1u);
  EXPECT_EQ(table.Names().count("bn.num_batches_tracked"), 1u);
}

TEST(ParameterTable, TensorsRoundTrip_DefaultsFillOnlyWhenAsked_ShapesAreChecked) {
  ParameterTable table = SmallTable();
  std::vector<float> flat(table.total());
  for (size_t i = 0; i < flat.size(); ++i) flat[i] = static_cast<float>(i);
  TensorMap tensors = table.ToTensors(flat);
  EXPECT_EQ(tensors.at("wte").shape, (std::vector<int64_t>{5, 2}));
  auto back = table.FromTensors(tensors, "f");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, flat);

  TensorMap only_wte = {{"wte", tensors.at("wte")}};
  EXPECT_EQ(table.FromTensors(only_wte, "f").status().message(), "f: tensor ln.weight is missing");
  auto defaulted = table.FromTensors(only_wte, "f", /*use_defaults=*/true);
  ASSERT_TRUE(defaulted.ok()) << defaulted.status();
  EXPECT_EQ((*defaulted)[10], 1.0f);
  EXPECT_EQ((*defaulted)[12], 0.0f);
  TensorMap wrong = tensors;
  wrong["wte"].shape = {2, 5};
  EXPECT_EQ(table.FromTensors(wrong, "f").status().message(),
            "f: tensor wte does not have the model's shape [5, 2]");
}

TEST(ParameterTable, Buffers_VariancesAtOrBelowMinusEpsAreRefused) {
  ParameterTable table = SmallTable();
  TensorMap tensors = table.BuffersToTensors({1.0f, 0.5f}, 7);
  EXPECT_EQ(tensors.at("bn.num_batches_tracked").values, std::vector<float>{7.0f});
  EXPECT_TRUE(table.BuffersFromTensors(tensors, "f").ok());
  tensors["bn.running_var"].values = {1.0f, -1.0f};
  EXPECT_FALSE(table.BuffersFromTensors(tensors, "f").ok());
}

}  // namespace
}  // namespace mptrain

namespace mptrain {
namespace {

ParameterTable ConvertingTable() {
  ParameterTable table;
  ParameterSpec wte;
  wte.name = "wte";
  wte.shape = {3, 2};  // Vp = 3 rows, a checkpoint holds V = 2.
  wte.checkpoint_rows = 2;
  table.Add(wte);
  ParameterSpec conv;
  conv.name = "c_attn.weight";
  conv.shape = {3, 2};  // [out, in] in the buffer; [in, out] = [2, 3] in a checkpoint.
  conv.transposed_in_checkpoint = true;
  table.Add(conv);
  table.EndGroup();
  return table;
}

TEST(ParameterTable, CheckpointForms_TransposeAndCutRows) {
  const ParameterTable table = ConvertingTable();
  EXPECT_EQ(table.total(), 12);
  EXPECT_EQ(table.parameters()[0].checkpoint_shape(), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(table.parameters()[1].checkpoint_shape(), (std::vector<int64_t>{2, 3}));
  // wte rows {0, 1}, {2, 3}, {4, 5} (padded); the matrix rows (out) {6, 7}, {8, 9}, {10, 11}.
  std::vector<float> flat(12);
  for (int i = 0; i < 12; ++i) flat[i] = static_cast<float>(i);
  const TensorMap tensors = table.ToTensors(flat);
  EXPECT_EQ(tensors.at("wte").shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(tensors.at("wte").values, (std::vector<float>{0, 1, 2, 3}));
  EXPECT_EQ(tensors.at("c_attn.weight").shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(tensors.at("c_attn.weight").values, (std::vector<float>{6, 8, 10, 7, 9, 11}));
  // Read back: the matrix transposed back, the padded rows 0.
  absl::StatusOr<std::vector<float>> read = table.FromTensors(tensors, "ckpt");
  ASSERT_TRUE(read.ok()) << read.status();
  std::vector<float> expected = flat;
  expected[4] = expected[5] = 0;
  EXPECT_EQ(*read, expected);
  // A file holding every row of wte is taken as it is.
  TensorMap padded = tensors;
  padded["wte"].shape = {3, 2};
  padded["wte"].values = {0, 1, 2, 3, 4, 5};
  read = table.FromTensors(padded, "ckpt");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, flat);
  // Any other shape is refused, naming both the model's forms and not the file's.
  TensorMap wrong = tensors;
  wrong["wte"].shape = {1, 4};
  absl::Status status = table.FromTensors(wrong, "ckpt").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("[2, 2]"), std::string::npos) << status;
  EXPECT_EQ(status.message().find("[1, 4]"), std::string::npos) << status;
  wrong = tensors;
  wrong["c_attn.weight"].shape = {3, 2};  // The buffer's own shape is not the checkpoint's.
  EXPECT_FALSE(table.FromTensors(wrong, "ckpt").ok());
}

}  // namespace
}  // namespace mptrain
