package pybk.spark.jvm;

import com.fasterxml.jackson.databind.ObjectMapper;

/** The one JSON mapper of the plan's exchange with Python (Jackson, which Spark ships). */
final class Json {
  static final ObjectMapper MAPPER = new ObjectMapper();

  private Json() {}
}
