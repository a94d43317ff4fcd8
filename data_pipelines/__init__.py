"""tf.data input pipelines for BERT-family pretraining: text -> tokens -> examples -> masked batches."""
